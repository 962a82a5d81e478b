"""The errata: every printed statement that fails, with its severity, its size and its story.

Each :class:`Erratum` is one story of ``docs/errata.md`` (its ``slug`` is the story's anchor)
and names the printed claims it explains; the table declares each by :func:`_story`, its texts as
labelled paragraphs. Every printed claim recorded as failing belongs to
exactly one erratum, and every erratum names at least one such claim (checked on import by
:func:`check`). ``docs/errata.md``'s index and metadata lines and ``docs/claims.md`` are
generated from this table (:mod:`proofs_check.docs`).

Severities (:data:`SEVERITIES`), from the heaviest:

* ``substantive``: an algorithm, equation, theorem or printed figure gives a wrong result in
  exact arithmetic, inside the paper's own setting;
* ``numerical``: right in exact arithmetic, wrong in floating point at the paper's precisions;
* ``out-of-setting``: fails only outside an assumption the paper makes (``setting`` names it);
* ``degenerate``: fails only in edge cases (a zero key, a zero residual, an infinite parameter);
* ``wording``: a definition, name, convention, proof step or sentence is misstated while every
  result the paper computes from it holds;
* ``rounding``: a printed number off in its last digit.

The headline count (``N fail as printed``) counts ``substantive`` and ``numerical`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fields import parse_text

SEVERITIES = ("substantive", "numerical", "out-of-setting", "degenerate", "wording", "rounding")
HEADLINE = ("substantive", "numerical")
MAGNITUDE_COMMAND = "python -m proofs_check.magnitudes"
NO_SIZE = "n/a:"  # a magnitude that says why no size applies starts with it


@dataclass(frozen=True)
class Erratum:
    """One erratum story.

    slug: anchor of the story in docs/errata.md. paper: key of :data:`proofs_check.claim.PAPERS`.
    title: the story's heading. claims: ids of the printed claims (recorded as failing) it explains.
    severity: one of :data:`SEVERITIES`; reason: why that severity, in one sentence.
    setting: for ``out-of-setting``, the assumption of the paper outside which it fails.
    magnitude: its size at the paper's own sizes (and the toy figure of the story beside it), or
    ``n/a: why`` where no size applies (wording, notation, a degenerate edge); every
    ``substantive`` and ``numerical`` erratum has a size. command: the command that prints that
    size (``python -m proofs_check.magnitudes NAME``); every size has one.
    affected: who is affected in practice, in one sentence.
    """

    slug: str
    paper: str
    title: str
    claims: tuple
    severity: str
    reason: str
    setting: str = ""
    magnitude: str = ""
    command: str = ""
    affected: str = ""

    @property
    def headline(self) -> bool:
        return self.severity in HEADLINE


def _story(
    slug: str, paper: str, claims: tuple, severity: str, text: str, command: str = ""
) -> Erratum:
    """An erratum from its text: the title, then paragraphs ``Why:`` (the reason for the severity),
    ``Setting:``, ``Magnitude:`` and ``Affected:``."""
    f = parse_text(
        text,
        f"erratum {slug}",
        {"Why": "reason", "Setting": "setting", "Magnitude": "magnitude", "Affected": "affected"},
    )
    return Erratum(slug, paper, f.pop("statement"), claims, severity, command=command, **f)


def _m(name: str) -> str:
    return f"{MAGNITUDE_COMMAND} {name}"


ERRATA = (
    # ------------------------------------------------------------------------------------ GKA
    _story(
        "gka-remark1-r30",
        "gka",
        ("gka.remark1.values.printed",),
        "rounding",
        """
        GKA appendix D.1, Remark 1: R^30 printed as 6 x 10^-5 (value 6.55 x 10^-5)

        Why: 6.547e-5 printed with one digit as 6e-5 (truncated, not rounded, and marked ~); the other nine numbers
        round correctly and the remark's conclusion is unaffected.

        Magnitude: R^30 = 6.55e-5 at kappa = 51, printed 6e-5 (8% low; to one digit it rounds to 7e-5).

        Affected: Nobody: the remark's conclusion (20 iterations suffice in bf16) holds.""",
        command=_m("gka_remark1_r30"),
    ),
    _story(
        "gka-eq49-q-sign",
        "gka",
        ("gka.eq49.printed", "gka.alg2.eq50.printed"),
        "substantive",
        """
        GKA appendix E.1, eq. (49) and Algorithm 2 eq. (50): wrong sign of the q term

        Why: Solving (44) for xi_{i-2} moves c_i q to the other side with a minus sign; with the printed plus the
        rebuilt iterates, hence dH, are wrong in exact arithmetic.

        Magnitude: dH relative error 48 at D = 128, kappa = 51, r = 30 (float64, against autograd through Algorithm
        1, eq. (53) corrected; dq unaffected: 6e-12). Toy: 17 at D = 8, kappa = 10, r = 5.

        Affected: Users of Algorithm 2 (the reverse backward) only: GKA trains with implicit differentiation (Sec.
        4.2.2), which does not rebuild iterates.""",
        command=_m("gka_algorithm2"),
    ),
    _story(
        "gka-alg2-c0",
        "gka",
        ("gka.alg2.eq53.printed", "gka.alg2.printed"),
        "substantive",
        """
        GKA Algorithm 2, eqs. (52)-(53): d xi_0 weighted by 4/(L+mu) instead of c_0 = 2/(L+mu)

        Why: (52) overwrites nu_0 with omega_0 = 2, so (53) weights d xi_0 by twice c_0; at r = 0 the printed dq is
        exactly twice the gradient.

        Magnitude: dq relative error 2.6e-4 at D = 128, kappa = 51, r = 30 (dH unaffected: 7e-12); exactly 1 (a
        factor 2) at r = 0; with (50) also as printed, dH error 49. Toy: dq 5.1e-2 at D = 8, kappa = 10, r = 5.

        Affected: Users of Algorithm 2 only (GKA itself trains with implicit differentiation); the error is largest
        for few iterations.""",
        command=_m("gka_algorithm2"),
    ),
    _story(
        "gka-remark2-stability",
        "gka",
        ("gka.remark2.stability.printed",),
        "numerical",
        """
        GKA appendix E.1, Remark 2: reversing (49) is not numerically stable (recovering the weights by (47) is worse)

        Why: Remark 2 claims only that reversing (49) 'can be done stably'; exact in exact arithmetic, in floating point
        it amplifies rounding by about R_a^-r, and recovering the weights by (47) (not claimed stable) by about
        R_a^-2r.

        Magnitude: At D = 128, kappa = 51, r = 30 (Algorithm 2 corrected, against the mpmath gradient of the loop):
        float32 dq 4.4e-3 (autograd 3.9e-7); bf16 storage dH 8.4e-2 (autograd 1.1e-2); bf16 strict dq 73 (autograd
        1.1e-2). Toy (D = 8): float32 dq 7.1e-3, bf16 storage dH 0.91.

        Affected: Users of Algorithm 2 in float32 or bf16 with r >~ 13-30; GKA trains with implicit differentiation
        (Sec. 4.2.2) and is not affected.""",
        command=_m("gka_remark2"),
    ),
    _story(
        "gka-alg2-inputs",
        "gka",
        ("gka.alg2.inputs.printed",),
        "wording",
        """
        GKA Algorithm 2, line 1: the Input line omits q and the forward's last iterates

        Why: The body reads q in (50) and xi_r, xi_{r-1} in its initialisation, none of which is listed (the line
        has an empty slot ', ,'); with them added, Algorithm 2 (corrected) is the gradient.

        Magnitude: n/a: wording (an Input line; nothing is computed from it).

        Affected: Implementers of Algorithm 2, who must keep q and the last two iterates from the forward pass.""",
    ),
    _story(
        "gka-eq15-sign",
        "gka",
        ("gka.eq15.printed",),
        "wording",
        """
        GKA appendix D.2, eq. (15): "+ w_t H_t" should be "- w_t H_t" (main text (7) is right)

        Why: A proof step: (15) is the last line of App. D.2's derivation ('which proves Lemma 1') and has the opposite
        sign of the w_t H_t term, while Lemma 1's (7), the (13) and (14) it follows from, and the boxed (40) all have
        -w_t H_t; nothing the paper computes uses (15).

        Magnitude: dk relative error 0.20 (gates in [0.9, 1]) and 0.40 (gates in [0.99, 1]) at D = 128, T = 256, a =
        0.02. Toy: 1.00 at T = 6, D = 4.

        Affected: Only readers who implement the key gradient from (15) instead of Lemma 1's (7): their dk would be off
        by the sizes above.""",
        command=_m("gka_eq15"),
    ),
    _story(
        "gka-eq40-gate-product",
        "gka",
        ("gka.eq40.printed",),
        "substantive",
        """
        GKA appendix D.2.1, eqs. (32)-(41): the gate product is off by one

        Why: prod_{i=l}^{t-1} gamma_i is the decay of a different recurrence; (CH) gives prod_{i=l+1}^{t} gamma_i.

        Magnitude: dk relative error 4.1e-2 (gates in [0.9, 1]) and 3.6e-3 (gates in [0.99, 1]) at D = 128, T = 256;
        0 when all gates are equal. Toy: 3.7e-2 at T = 6, D = 3.

        Affected: Readers implementing the boxed (40); the main text's (7)-(9) use M_{i,t} and are right.""",
        command=_m("gka_eq40"),
    ),
    _story(
        "gka-eq24-sign",
        "gka",
        ("gka.eq24.printed",),
        "substantive",
        """
        GKA appendix D.2, eq. (24): both gate-gradient parts have the wrong sign

        Why: Substituting dH_c = -1/2 w_c H_c into (22) gives the negation of both printed parts (the slip of (15)).

        Magnitude: The two parts of dG due to the w_t H_t term are negated: relative error exactly 2 on those
        parts at every size (2 at D = 128, C = 64, gates in [0.9, 1]; corrected 3e-16); the rest of dG, eqs.
        (16)-(23), is right.

        Affected: Anyone implementing the gate gradient from App. D.2, the only place it is given; in training the
        gates would be pushed the wrong way by this part.""",
        command=_m("gka_eq24"),
    ),
    _story(
        "gka-chunk-matvec",
        "gka",
        ("gka.chunk_matvec.printed",),
        "wording",
        """
        GKA Sec. 4.2.1: "H_{[t]+1} xi via H_{[t]} xi + gamma_1 k k^T xi" puts the decay on the wrong term

        Why: An illustrative sentence ('for example, we can compute ... via ...') puts the gate on the new key; (CH)
        printed just above (H_t = gamma_t H_{t-1} + k_t k_t^T) and H_c = zeta_c H_0 + sum_j M_{j,c} k_j k_j^T right
        after are correct, and nothing the paper computes uses the sentence.

        Magnitude: An implementation following the sentence would get H_{[t]+1} xi with relative error 0.11 (gamma =
        0.9) and 1.0e-2 (gamma = 0.99) with a 64-token chunk state, D = 128. Toy: 0.25 (2.5 vs 2.0) at D = 1.

        Affected: Implementations of the chunkwise forward that follow this sentence; eq. (5) itself is right.""",
        command=_m("gka_chunk_matvec"),
    ),
    _story(
        "gka-cross-chunk",
        "gka",
        ("gka.cross_chunk.printed",),
        "substantive",
        """
        GKA Sec. 4.2.2, cross-chunk term: coefficient zeta_C should be M_{i,C}; two typos

        Why: By (10) the cross-chunk part of B_i k_i is M_{i,C} Bt_{C+1} k_i; zeta_C = M_{1,C} gamma_1 is right for
        the chunk-level recursion only.

        Magnitude: B_i k_i relative error 0.14 (gates in [0.9, 1]) and 4.9e-3 (gates in [0.99, 1]) at D = 128, T =
        256, C = 64. Toy: 7.0e-3 at T = 8, C = 3.

        Affected: Implementations of the chunkwise backward of Sec. 4.2.2 (the implicit-differentiation path GKA
        trains with), if they follow the printed coefficient.""",
        command=_m("gka_cross_chunk"),
    ),
    _story(
        "gka-intra-chunk-product",
        "gka",
        ("gka.intra_chunk.printed",),
        "wording",
        """
        GKA Sec. 4.2.2, intra-chunk matrix form: H_0 (diag(b) K_C) multiplies C x C by D x C

        Why: The factors of a product are swapped: as printed it is undefined unless C = D; the intended H_0 K_C
        diag(b) is unambiguous from the sum it abbreviates.

        Magnitude: n/a: notation (swapped factors; the sum it abbreviates is right).

        Affected: Nobody who reads the sum it abbreviates.""",
    ),
    _story(
        "gka-gdn-step",
        "gka",
        ("gka.gdn_step.printed",),
        "wording",
        """
        GKA Sec. 2, (GDN) and eq. (2): (GDN) is a gradient step of size beta_t/2 on eq. (2) (beta_t on (1/2)||S k -
        v||^2), not beta_t

        Why: An interpretive sentence misses the factor 2 of the gradient of ||S k - v||^2 (the usual 1/2
        convention); the (GDN) recurrence itself is right.

        Magnitude: n/a: wording (an interpretive sentence; the (GDN) recurrence is right).

        Affected: Nobody: no computation uses the interpretation.""",
    ),
    _story(
        "gka-bf16-eps",
        "gka",
        ("gka.reported.worst_case.printed",),
        "rounding",
        """
        GKA Sec. 3.2: bfloat16's epsilon is 0.0078, not 0.007 (eps kappa = 3.9 at kappa = 500)

        Why: 2^-7 = 0.0078 printed as ~0.007 inside an order-of-magnitude argument (worst case 3.9, printed 3.5)
        whose conclusion holds.

        Magnitude: epsilon 2^-7 = 0.00781, printed 0.007 (10% low); eps kappa at kappa = 500: 3.91, printed
        3.5.

        Affected: Nobody: strong regularisation is needed in bf16 either way.""",
        command=_m("gka_bf16_eps"),
    ),
    # ------------------------------------------------------------------------------------ KLA
    _story(
        "kla-prop5",
        "kla",
        ("kla.prop5.printed",),
        "substantive",
        """
        KLA App. B, Proposition 5, eq. (19): the WY recurrence of P_i misses the decay

        Why: The proof's fourth line writes gamma_{i->i} k_i for alpha_i gamma_{i-1} k_i = gamma_i k_i; wrong under
        either reading of gamma_{j->i}.

        Magnitude: P_C relative error 3.8 (alpha in [0.9, 1]) and 8.8e-2 (alpha in [0.99, 1]) at C = 64, d_k = 128,
        unit keys, beta = 1/2. Toy: 0.5 at one token.

        Affected: Only implementations of the WY recurrences (18)-(19); Prop. 3's system (7), which Algorithm 1 and
        GDN kernels solve, is derived correctly and holds.""",
        command=_m("kla_prop5"),
    ),
    _story(
        "kla-gamma-definition",
        "kla",
        ("kla.prop6.printed",),
        "wording",
        """
        KLA App. B, definition of gamma_{j->i} (used by Props. 5-6): off by one factor

        Why: The definition's product starts at r = j instead of j + 1; App. B.1 then substitutes the right ratio
        gamma_i/gamma_r, with which (20)-(21) hold exactly.

        Magnitude: n/a: notation (App. B.1 substitutes the right ratio).

        Affected: Readers who take the definition literally; the paper's own substitution is right.""",
    ),
    _story(
        "kla-rspace",
        "kla",
        ("kla.appB.rspace.printed",),
        "wording",
        """
        KLA App. B: "R_i = P_i R_0 + H_i" mixes the state and its transpose

        Why: Notation: R (= S^T) is written where S is meant (P_i R_0 is undefined when d_k != d_v); the S-space
        forms the appendix goes on to use, (18)-(22) and Prop. 3, hold.

        Magnitude: n/a: notation (R written for S).

        Affected: Nobody who follows the S-space formulas that come next.""",
    ),
    _story(
        "kla-table6",
        "kla",
        ("kla.table6.printed",),
        "substantive",
        """
        KLA Table 6: the recurrent forms of DeltaNet, GDN and KLA drop the write coefficient beta_j

        Why: Each term of the unrolled sum needs the write coefficient beta_j (for KLA, eta_j/(||k_j||^2 + eps)).

        Magnitude: o_T relative error 1.0 at T = 64, d = 128 (keys N(0, 1/d), eta = sigmoid(N(0, 1))): without
        beta_j term j is off by the factor 1/beta_j ~ ||k_j||^2/eta_j. Toy: 1 at one token.

        Affected: Readers of Table 6 only; the recurrence (6) and Algorithm 1 include beta_j.""",
        command=_m("kla_table6"),
    ),
    _story(
        "kla-alg1-panels",
        "kla",
        ("kla.alg1.panels.printed",),
        "out-of-setting",
        """
        KLA Algorithm 1, right panel, line 7: the chunk outputs lack the 1/||q|| of line 6

        Why: The panels differ only for queries that are not unit vectors; Sec. 3.3 l2-normalises q before the
        readout, and then lines 6 and 7 agree.

        Setting: queries l2-normalised before the readout (Sec. 3.3)

        Magnitude: None in the paper's setting: with unit queries (Sec. 3.3) the panels agree (1e-16 at T =
        64, d = 128, chunks of 64); with N(0, 1) queries (||q|| ~ 11) line 7's outputs have relative error
        10.3.

        Affected: Only users who feed unnormalised queries to the chunkwise kernel.""",
        command=_m("kla_alg1_panels"),
    ),
    _story(
        "kla-prop1-mu",
        "kla",
        ("kla.prop1.printed",),
        "degenerate",
        """
        KLA Proposition 1: mu is undefined at eta = 1, eps = 0, inside the stated range

        Why: At eta = 1, eps = 0 mu = 1/0: the statement is then Theorem 1's constrained problem, the mu -> infinity
        limit.

        Magnitude: n/a: degenerate (one parameter point, eta = 1 with eps = 0, where mu = 1/0; no error
        elsewhere).

        Affected: Nobody: the unrelaxed case is covered by Theorem 1.""",
    ),
    _story(
        "kla-prop2-edges",
        "kla",
        ("kla.prop2.printed",),
        "degenerate",
        """
        KLA Proposition 2 and App. A.4: the factor is 1 for a zero key, and "<" fails for e_t = 0

        Why: Only k_t = 0 (factor 1, no contraction) and e_t = 0 (nothing to contract) break it; eq. (5) and the
        loss decrease hold always.

        Magnitude: n/a: degenerate (a zero key or a zero residual only; no error elsewhere).

        Affected: Nobody in practice: a zero key writes nothing.""",
    ),
    # ----------------------------------------------------------------------------------- Echo
    _story(
        "echo-footnote1",
        "echo",
        ("echo.s321.footnote1.printed",),
        "substantive",
        """
        Echo section 3.2.1, footnote 1: rescaling by (m_old/m_new)^2 is wrong for C_v and eps I

        Why: C_v is linear in the normalised key, so it scales by m_old/m_new, not its square; eps I is not data and
        must not be rescaled.

        Magnitude: Streamed C_v relative error 5.9e-2 after T = 2048 Gaussian keys (r = 48, P = 64; 9 running-max
        updates, final max 1.4x the first). Toy: 0.60 at one update by 2.5x.

        Affected: Streaming or decoding implementations that follow the footnote's running-max rescaling; the
        training path recomputes with the sequence max.""",
        command=_m("echo_footnote1"),
    ),
    _story(
        "echo-a1-eq19",
        "echo",
        ("echo.a1.eq19.printed",),
        "wording",
        """
        Echo Prop. A.1, eq. (19): the stationary point is printed as M^T G^{-1}

        Why: A proof step: d/dA of -2 tr(A sum z_t z_{t+1}^T) is -2M, and the 'transposing both sides' that follows
        does not fix it; the proposition's statement A* = M G^{-1} holds.

        Magnitude: n/a: wording (a proof step; the proposition's statement holds).

        Affected: Nobody: the proposition, which the layer uses, is right.""",
    ),
    _story(
        "echo-layer-gram",
        "echo",
        ("echo.s323.layer_estimator.printed",),
        "wording",
        """
        Echo eqs. (4), (53) vs Prop. A.1: the layer's operator is not A.1's least-squares estimator (its G includes
        the last token)

        Why: The paper never states that the layer's M G~^{-1} is the minimiser of Prop. A.1's objective (SKA 'adapts
        the same least-squares estimation structure', Sec. 2.3; 'fits a whitened Koopman operator', abstract); read
        so, it is not: its G sums z_T z_T^T (shared with B_v by design), so it minimises the objective with ||A
        z_T||^2 added; Props. A.2, A.3 and C.1 hold for any M, G.

        Magnitude: What differs: the layer's operator and A.1's estimator at r = 48 (AR(1) keys, eps = 1e-3): 31% at T
        = 64, 4.7% at T = 256, 0.6% at T = 1024 (O(r/T)). Toy: 58% at T = 12, r = 4.

        Affected: Readers who take the layer's operator for A.1's estimator (short prefixes and chunk-causal chunks,
        T of a few r); the layer computes what eqs. (4) and (53) define.""",
        command=_m("echo_layer_estimator"),
    ),
    _story(
        "echo-eq11-aw",
        "echo",
        ("echo.eq11.printed",),
        "substantive",
        """
        Echo eq. (11) vs eq. (22): "A_w" names two different operators

        Why: Eqs. (12)-(13) normalise and apply 'A_w' to the whitened query; with eq. (11)'s A_w = M G^{-1} (not the
        whitened L^{-1} M L^{-T} of eq. (22), App. F and Sec. 6.1) the readout is wrong, and Remark 4's 'gradient
        spikes ... when the unnormalized operator has sigma_max >> 1' fits only eq. (11)'s operator.

        Magnitude: Readout relative difference 20% at r = 48, T = 1024 (AR(1) keys, K = 2, exact sigma). Over 2000
        random SKA statistics (r <= 16, T <= 64) max ||M G~^{-1}|| = 18.2 against max ||A_w|| = 0.9997 (<= 1 -
        eps/lambda_max(G~) < 1). Toy: 59% at T = 30, r = 6.

        Affected: Implementations built from Sec. 3.2.3 alone; App. F's algorithm uses the whitened operator and is
        right.""",
        command=_m("echo_eq11"),
    ),
    _story(
        "echo-remark2-similar",
        "echo",
        ("echo.a3.remark2.printed",),
        "wording",
        """
        Echo Remark 2: G~^{-1} M does have the spectrum of M G~^{-1}

        Why: A motivating remark states a false fact (XY and YX always share eigenvalues); the whitened form it
        motivates is still the better choice, for its norm.

        Magnitude: n/a: wording (a remark; no computed quantity depends on it).

        Affected: Nobody: no computed quantity depends on the remark.""",
    ),
    _story(
        "echo-f6-power",
        "echo",
        ("echo.f6.power.printed",),
        "out-of-setting",
        """
        Echo Appendix F step 6 / eq. (12) with Props. D.2, D.3: the 6-step power estimate does not give ||A^_w|| <=
        1

        Why: Fails for general matrices (diag(2, 1.9)); for SKA's own whitened operator ||A_w||_2 <= 1 -
        eps/lambda_max(G~) < 1 (docs/koopman.md), so eq. (12) never rescales it and D.2/D.3 hold with either sigma.

        Setting: the operator normalised is SKA's whitened A_w (norm below 1), not a general matrix

        Magnitude: None in the setting: SKA's whitened A_w (r = 48, T = 1024 AR(1) keys) has ||A_w|| = 0.923 <
        1 and is left as is; outside it, diag(2, 1.9) normalises to ||A^|| = 1.01 > 1.

        Affected: Only reuses of eq. (12) with a 6-step power estimate on other operators.""",
        command=_m("echo_f6_power"),
    ),
    _story(
        "echo-remark3",
        "echo",
        ("echo.d1.remark3.printed",),
        "rounding",
        """
        Echo Remark 3: |lambda|^K is the amplitude kept, not the energy; the K = 4 threshold is 0.841, not 0.85

        Why: 0.5^(1/4) = 0.8409 printed as 0.85 (and 'energy' for amplitude); the remark's point, that K = 4 keeps
        only slowly decaying modes, holds.

        Magnitude: The K = 4 threshold 0.5^(1/4) = 0.841, printed 0.85 (the 50%-energy threshold is 0.917).

        Affected: Nobody: the choice K = 2 does not depend on it.""",
        command=_m("echo_remark3"),
    ),
    _story(
        "echo-state-size",
        "echo",
        ("echo.reported.state_size.printed",),
        "substantive",
        """
        Echo sections 3.5 and 6.2: the SKA state is ~1.1 MB (50M) and ~0.95 MB (180M), not "~77 KB"

        Why: The paper's own formula 2r^2 + Pr + r + 1 floats per head gives 9913 floats per head; 77 KB is one or
        two heads' worth.

        Magnitude: 50M model: 1,110,256 B = 1084 KiB (14.1x the printed 77 KB); 180M model: 951,648 B = 929
        KiB (12.1x). Exact at the paper's sizes.

        Affected: Memory planning for decoding; the state is still independent of T.""",
        command=_m("echo_state_size"),
    ),
    _story(
        "echo-chunk-causal",
        "echo",
        ("echo.chunk_causal.printed",),
        "substantive",
        """
        Echo chunk-causal mode (eqs. (3), (7)-(10)): the sequence max leaks later tokens

        Why: Chunk c's operator is said to use strictly preceding chunks, but eq. (3) divides every key by a max
        over the whole sequence, so a later token changes earlier outputs.

        Magnitude: At S = 64, r = 48, T = 1024 (AR(1) keys), the last key x10: chunk 1's outputs change by 89%,
        chunk 15's by 1.5%; x2: 16% and 0.03%. Toy: 43% at T = 24, S = 6, r = 4.

        Affected: Training in chunk-causal mode: outputs see the future through one scalar; decoding (frozen scale)
        is causal.""",
        command=_m("echo_chunk_causal"),
    ),
    _story(
        "echo-jacobian-rank",
        "echo",
        ("echo.s323.jacobian_full_rank.printed",),
        "degenerate",
        """
        Echo section 3.2.3: the SKA Jacobian is not "a product of full-rank matrices by construction"

        Why: Fails when M = 0 (one token), P < r or the values span fewer than r directions; App. J.3's Prop. J.5
        gives the conditions, met generically at the paper's P = 64 >= r = 48.

        Magnitude: n/a: degenerate (one token, P < r, or values spanning fewer than r directions; at the
        paper's P = 64 >= r = 48 the rank is r generically).

        Affected: Chunk-causal training (LM): chunk 0 has G = eps I, M = C_v = 0, so J = 0 for the first S = 64
        positions; beyond them nobody at the paper's sizes.""",
    ),
    _story(
        "echo-rotation",
        "echo",
        ("echo.s33.rotation.printed",),
        "wording",
        """
        Echo section 3.3: the Koopman MLP's R is orthogonal only when every |lambda_i| = 1

        Why: A sentence of Sec. 3.3: each block is |lambda_i| times a rotation and the modulus is clamped to <= 1, so
        sigma_min(R) = min |lambda_i|; the paper's own App. J.4, Prop. J.7, states it correctly (||R||_2 = max rho_i <=
        1, 'not orthogonal unless rho_i = 1 for every block'), and the bounds it derives (J.8, J.9) use that.

        Magnitude: sigma_min(R) = min_i |lambda_i| per layer; the paper prints no learned moduli, so the size
        in its trained models cannot be computed. At d_k = 2048 with one mode at |lambda| = 0.5: sigma_min(R)
        = 0.5 against the printed 1, and that mode's gradient is halved.

        Affected: The 'gradient preservation' argument of Sec. 3.3 for any model whose eigenvalues move inside the
        unit disk.""",
        command=_m("echo_rotation"),
    ),
    _story(
        "echo-i10-unavoidable",
        "echo",
        ("echo.i10.regime.printed",),
        "wording",
        """
        Echo Appendix I.10: linear attention's error is not "unavoidable"

        Why: (kappa - 1)/(kappa + 1) is the minimax value over queries, attained by queries mixing the extreme
        eigenvectors; 'unavoidable' is true in that sense, not for every query.

        Magnitude: n/a: wording (a minimax statement read as one for every query).

        Affected: Nobody.""",
    ),
    _story(
        "echo-hellaswag",
        "echo",
        ("echo.reported.hellaswag.printed",),
        "rounding",
        """
        Echo section 5.3: HellaSwag 44.0 in the text, 44.3 in Table 4

        Why: Text and table differ in the last digit; the 'best on 5 of 6 benchmarks' statement holds with either.

        Magnitude: 0.3 points: 44.0 in the text, 44.3 in Table 4.

        Affected: Nobody.""",
        command=_m("echo_hellaswag"),
    ),
    _story(
        "echo-flops",
        "echo",
        ("echo.reported.flops.printed",),
        "wording",
        """
        Echo section 3.6: the Koopman MLP does not have "identical FLOPs per token"

        Why: It saves a third of the FLOPs as well as of the parameters (two matmuls instead of three); the sentence
        undersells it.

        Magnitude: Koopman MLP / SwiGLU FLOPs per token 0.667 at d = 768 (6,297,600 against 9,437,184),
        printed identical (1).

        Affected: Nobody: the truth is cheaper than printed.""",
        command=_m("echo_flops"),
    ),
    _story(
        "echo-complexity",
        "echo",
        ("echo.reported.complexity.printed",),
        "substantive",
        """
        Echo section 3.6 and Table 1: SKA's training cost is linear in T, not sublinear

        Why: One rank-one update per token and one O(r^3) Cholesky per chunk cost T r^2 + ceil(T/S) r^3, linear in
        T; the printed O(T r^2/S + r^3) is neither.

        Magnitude: Doubling T doubles the cost (cost(2T)/cost(T) = 2 at T = 2048 and 65536, r = 48, S = 64), and the
        printed T-term T r^2/S is S = 64 times smaller than the statistics cost T r^2 alone.

        Affected: Cost estimates for long-context training.""",
        command=_m("echo_complexity"),
    ),
    # ---------------------------------------------------------------------------------- gates
    _story(
        "gates-balanced-scale",
        "gates",
        ("gates.balanced.scale.printed",),
        "substantive",
        """
        Proposal, "Gradient scale": |phi'(z)|/phi(z)^2 is not 2a|z| for phi = 1 - 1/(a z^2 + b)

        Why: |phi'|/phi^2 = 2a|z|/(a z^2 + b - 1)^2 (2/|z|^3 for a = b = 1), and the comparison table computes the
        sigmoid's row with the same |phi'|/phi^2, so the printed table is wrong in exact arithmetic under either
        ratio; the premise survives with StableSSM's discrete-time |phi'|/(1 - phi)^2, which is 2a|z| for phi and
        e^z (unbounded) for the sigmoid.

        Magnitude: At the proposal's a = b = 1: alpha = 0.99 (z = 9.95) has |phi'|/phi^2 = 2.0e-3 against the
        printed 20 (1e4x); alpha = 0.5 (z = 1): 2 = 2 (the only agreement).

        Affected: The proposal's motivation and its 'balanced' comparison table; the gate itself works as a
        function.""",
        command=_m("gates_scale"),
    ),
    _story(
        "gates-softplus",
        "gates",
        ("gates.softplus.printed",),
        "substantive",
        """
        Proposal, baseline 3 and table row "Softplus-based": 1 - exp(-softplus(z)) is the sigmoid

        Why: exp(-softplus(z)) = 1/(1 + e^z), so the 'exponential' baseline is sigma(z) identically and its row
        should equal the sigmoid row.

        Magnitude: Identical to the sigmoid at every z (exact: 1e-51 at 50 digits); evaluated as printed in
        float64 it only adds cancellation: relative error 1.7e-4 at z = -30, no correct digit below z = -37.4.

        Affected: Experiments that run baseline 3 as a separate arm: it duplicates the sigmoid arm.""",
        command=_m("gates_softplus"),
    ),
    _story(
        "gates-sigmoid-ratio",
        "gates",
        ("gates.effect.sigmoid.printed",),
        "substantive",
        """
        Proposal, "Effect on optimization": sigma'(4.6) is 25x, not 100x, smaller than sigma'(0)

        Why: 0.25/0.0099 = 25; the printed 100x compares 0.01 with 1.

        Magnitude: 25.25x (alpha = 0.99; 25.37x at z = 4.6) against the printed 100x: the imbalance is
        overstated 4x.

        Affected: The proposal's quantitative motivation.""",
        command=_m("gates_sigmoid_ratio"),
    ),
    _story(
        "gates-log-domain",
        "gates",
        ("gates.log_domain.printed",),
        "numerical",
        """
        Proposal, log-space paragraphs: log phi(z) is -inf near z = 0 in floating point, unlike the sigmoid

        Why: In exact arithmetic it fails only at the single point z = 0 (phi(0) = 0 with the default b = 1); evaluated
        as printed, z^2 + 1 rounds to 1 for small z, so log phi is -inf on a band of pre-activations, while the
        sigmoid's log is finite everywhere.

        Magnitude: At a = b = 1, log(1 - 1/(z^2 + 1)) evaluated as printed is -inf for |z| <= 2^-12 = 2.4e-4 in
        float32 (1.9e-4 of N(0, 1) pre-activations) and |z| <= 2^-4 = 0.0625 in bf16 (5% of them); a -inf makes the
        cumulative G_c -inf and G_c - G_j NaN.

        Affected: Log-space chunked implementations with b = 1 that evaluate log phi as printed; b > 1, or log(z^2) -
        log(z^2 + 1) computed without the cancellation, avoids it.""",
        command=_m("gates_log_domain"),
    ),
    _story(
        "gates-stablessm-range",
        "gates",
        ("gates.stablessm_discrete.range.printed",),
        "out-of-setting",
        """
        Proposal, background: f*(w) = 1 - 1/(a w^2 + b) maps into (-1, 1) only for b > 1/2

        Why: At w = 0, f* = 1 - 1/b: -1 at b = 1/2, -3 at b = 1/4; the proposal's default b = 1 is inside.

        Setting: the proposal's b = 1 (it states only a, b > 0)

        Magnitude: None at the proposal's b = 1 (range [0, 1)); the range's lower end 1 - 1/b is -1 at b = 1/2
        and -3 at b = 1/4.

        Affected: Nobody using the proposal's parameters.""",
        command=_m("gates_stablessm_range"),
    ),
)


def by_claim() -> dict:
    """Printed claim id -> its :class:`Erratum`."""
    return {cid: e for e in ERRATA for cid in e.claims}


def severity_of(claim_id: str):
    e = by_claim().get(claim_id)
    return None if e is None else e.severity


def check(claims) -> list:
    """Bookkeeping problems between the registered ``claims`` and :data:`ERRATA` (empty when consistent)."""
    from .claim import FAILS, PRINTED

    problems = []
    failing = {c.id for c in claims if c.form == PRINTED and c.expected == FAILS}
    owned = [cid for e in ERRATA for cid in e.claims]
    slugs = [e.slug for e in ERRATA]
    problems += [f"erratum slug {s} used twice" for s in set(slugs) if slugs.count(s) > 1]
    problems += [f"claim {c} is in two errata" for c in set(owned) if owned.count(c) > 1]
    problems += [
        f"failing printed claim {c} has no erratum story" for c in sorted(failing - set(owned))
    ]
    problems += [
        f"erratum names {c}, which is not a failing printed claim"
        for c in sorted(set(owned) - failing)
    ]
    for e in ERRATA:
        if e.severity not in SEVERITIES:
            problems.append(f"{e.slug}: unknown severity {e.severity!r}")
        if not e.claims or not e.reason or not e.affected:
            problems.append(f"{e.slug}: needs claims, a reason and who is affected")
        if e.headline and (not e.magnitude or e.magnitude.startswith(NO_SIZE)):
            problems.append(
                f"{e.slug}: a {e.severity} erratum needs its magnitude at the paper's sizes"
            )
        elif not e.magnitude:
            problems.append(
                f"{e.slug}: needs its size at the paper's sizes, or '{NO_SIZE} why' where none applies"
            )
        if e.magnitude and not e.magnitude.startswith(NO_SIZE) and not e.command:
            problems.append(f"{e.slug}: its size needs the command that prints it")
        if (e.severity == "out-of-setting") != bool(e.setting):
            problems.append(f"{e.slug}: the setting is named exactly for out-of-setting errata")
    return problems
