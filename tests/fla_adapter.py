"""flash-linear-attention's chunk_gated_delta_rule run as KLA (a kernel that is not ours),
for the harness example in docs/harness.md.

KLA's token update (KLA Algorithm 1) is the gated delta rule with the Kaczmarz coefficient
``beta_t = eta_t / (||k_t||^2 + eps)`` (eq. (3)) and decay ``exp(g_t) = alpha_t``; its
readout normalises the query. ``kla_via_fla`` takes solvers.kla_chunkwise's arguments
(per-head decay, fla's layout ``(B, T, H, d)``) and returns ``(o, S_T)`` with S_T
``(B, H, d_k, d_v)``, as the reference does.

    python3 tests/fla_adapter.py      # smoke run on a GPU with fla installed
"""

import torch


def kla_via_fla(q, k, v, *, alpha, eta, eps: float = 1e-6, chunk_size: int = 64, initial_state=None,
                coefficient: str = "kaczmarz", normalize_queries: bool = True, return_final_state: bool = True):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    if coefficient != "kaczmarz" or not normalize_queries or chunk_size != 64:
        raise ValueError("the adapter covers KLA: coefficient='kaczmarz', normalised queries, fla's chunk of 64")
    alpha = torch.as_tensor(alpha, dtype=torch.float32, device=q.device).expand(q.shape[:-1])
    eta = torch.as_tensor(eta, dtype=torch.float32, device=q.device).expand(q.shape[:-1])
    beta = eta / (k.float().pow(2).sum(-1) + eps)
    qn = (q.float() / q.float().norm(dim=-1, keepdim=True)).to(q.dtype)
    o, S = chunk_gated_delta_rule(qn, k, v, g=torch.log(alpha), beta=beta.to(q.dtype), scale=1.0,
                                  initial_state=initial_state, output_final_state=True)
    return (o, S.to(q.dtype)) if return_final_state else o


def main():
    import solvers

    torch.manual_seed(0)
    B, T, H, dk, dv = 2, 300, 2, 64, 64
    q = torch.randn(B, T, H, dk, device="cuda").bfloat16()
    k = torch.randn(B, T, H, dk, device="cuda").bfloat16()
    v = torch.randn(B, T, H, dv, device="cuda").bfloat16()
    alpha = torch.rand(B, T, H, device="cuda") * 0.1 + 0.9
    eta = torch.rand(B, T, H, device="cuda") + 0.5
    o, S = kla_via_fla(q, k, v, alpha=alpha, eta=eta)
    ro, rS = solvers.kla_recurrent(q.float(), k.float(), v.float(), alpha=alpha, eta=eta)
    print("fla chunk_gated_delta_rule as KLA vs solvers.kla_recurrent (float32 on the bf16 inputs):")
    print(f"  o: rel err {float((o.float() - ro).norm() / ro.norm()):.3e}   S_T: rel err "
          f"{float((S.float() - rS).norm() / rS.norm()):.3e}   shapes {tuple(o.shape)} {tuple(S.shape)}")


if __name__ == "__main__":
    main()
