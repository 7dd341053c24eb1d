"""The reviewers' questions of both papers and the claims out of reach at this scale, as tables that
`make_report.py` renders into REPORT.md.

QUESTIONS: one row per question of the public reviews (TernGrad, NIPS 2017, paper 970; Jiang &
Agrawal, NeurIPS 2018, paper 1261), each the reviewer's point in a few words (paraphrased), and
what answers it: `rows`, a tuple of (figure prefix, claim name) pairs that must exist in the
figures' claims tables (make_report marks a missing one), and `note`, the answer's reading or why
the question cannot be answered at this scale.

UNTESTABLE: the papers' claims this repository cannot test at its scale, as `_theme.untestable` rows
(verdict "untestable here", with what would test them).

WORDS: the words each claim row tests, quoted once, with where a reader finds them (`words(key)`
gives the `paper` cell) and, for an accuracy claim, its one margin in points with the reading of the
words that gives it (`margin(key)`, `reading(key)`): every figure that tests the claim uses it.
"""

from __future__ import annotations

from _rules import NO_LOSS_RULE
from _theme import UNCHECKED, source, untestable

WORDS = {
    "no-loss": dict(src="tg-abstract", words="Our experiments show that applying TernGrad on AlexNet does not incur "
                    "any accuracy loss and can even improve accuracy.", margin=0.0,
                    reading="\"does not incur any accuracy loss\": the method's accuracy is not below fp32's "
                            "(non-inferiority, " + NO_LOSS_RULE + ")"),
    "under-2": dict(src="tg-abstract", words="The accuracy loss of GoogLeNet induced by TernGrad is less than 2% on "
                    "average.", margin=2.0,
                    reading="\"less than 2% on average\": the mean loss over seeds under 2 points of accuracy "
                            "(non-inferiority, margin 2 points)"),
    "workers": dict(src="tg-body", where="Table 1 (CIFAR-10)", words="paraphrase: TernGrad's accuracy stays within "
                    "about 0.5 points of fp32's up to 8 workers", margin=1.0,
                    reading="\"within about 0.5 points\" read as within 1 point (equivalence, margin 1 point; "
                            "the paper's 0.5 is one run per setting)"),
    "comm": dict(src="tg-abstract", words="Our approach requires only three numerical levels {-1,0,1}, which can "
                 "aggressively reduce the communication time."),
    "speed": dict(src="tg-abstract", words="Experiments show significant speed gains for various deep neural "
                  "networks."),
    "fp16": dict(src="tg-review", n=2, words="You compare this to 32bit floats, but for many setups, quantizing to "
                 "16bit is reasonably safe and training converges to same accuracy than when using floats for the "
                 "gradient."),
    "layerwise": dict(src="tg-review", n=1, words="The authors should elaborate the choices made in layer-wise "
                      "ternarizing in the experiments reported."),
    "tuned": dict(src="ja-review", n=1, words="Eg were the learning rates optimized individually for both QSGD and "
                  "terngrad, and all setups of compute nodes?"),
    "fixed-error": dict(src="ja-review", n=2, words="It will be good if the authors can compare in future versions of "
                        "the paper through simulations, the total communication for a fixed error threshold, of "
                        "various algorithms."),
    "diverge": dict(src="ja-review", n=3, words="according to [5], simply averaging the parameters in a period may "
                    "lead to divergence. Did you meet this problem? Can you report the accuracies of the compared "
                    "methods?"),
    "pqasgd": dict(src="ja-abstract", words="our PQASGD can converge as fast as full-communication SGD with only "
                   "3%-5% communication data size."),
    "links": dict(src="ja-review", n=4, words="Currently, there exists much wider bandwidth networks than 1Gbps, what is "
                  "the performance of the proposed method using network with larger bandwidth?"),
    "qsgd-bits": dict(src="ja-review", n=4, words="What is the exact number of bits used for QSGD in the experiments?"),
}


def words(key: str) -> str:
    """The `paper` cell of claim `key` (WORDS): the quoted words and their source."""
    w = WORDS[key]
    return source(w["src"], w["words"], **{k: w[k] for k in ("n", "where") if k in w})


def margin(key: str) -> float:
    """The one margin (points of accuracy) of claim `key`, from its own words (WORDS)."""
    return WORDS[key]["margin"]


def reading(key: str) -> str:
    """How claim `key`'s words give its margin, stated once in its test column."""
    return WORDS[key]["reading"]

TERNGRAD = "Wen et al. 2017 (TernGrad)"
# the runs that would answer Jiang & Agrawal's reviewer 4 on PQASGD with fewer-bit QSGD as its quantizer
# (labels NAME[options]+pqasgd: tgsim.analysis.common.split_label); fig08 / fig09 would read them
R4_METHODS = ("fp32,qsgd[levels=1],qsgd[levels=3],qsgd[levels=8],terngrad+pqasgd,qsgd[levels=1]+pqasgd,"
              "qsgd[levels=3]+pqasgd,qsgd[levels=8]+pqasgd")
R4_COMMAND = (f"`tgsim compare speedup --methods '{R4_METHODS}' --out papers_figures/out/compare-speedup-r4` "
              f"(iterations to ε against M and the compression ratio) and `tgsim compare bits --methods "
              f"'{R4_METHODS}' --out papers_figures/out/compare-bits-r4` (bits and accuracy to the loss target)")
JIANG = "Jiang & Agrawal 2018"

QUESTIONS = [
    dict(paper=TERNGRAD, reviewer="R1", question="elaborate the choices made in layer-wise ternarizing",
         rows=(("fig02", "one scaler per layer narrows the gap (whole model)"),
               ("fig10", "one scaler per layer lowers the error (MLP, clipping 2.5σ)"),
               ("fig11", "one scaler per layer beats one for the whole model: accuracy (paper quantizer; own-lr)"),
               ("fig11", "one scaler per layer beats one for the whole model: bits to the target (paper quantizer; "
                         "own-lr)")),
         note="partly: the gap on the convnet (one run); on an MLP over seeds the error incl. the bias of clipping, "
              "with and without clipping (the claim counted once, the other rows supporting it); on the torch models "
              "(fig11) two rows, the accuracy at the common step and the bits to the target, each judged per model"),
    dict(paper=TERNGRAD, reviewer="R1", question="an analysis of lines 168-169 and their trade-offs",
         rows=(), note="cannot be answered here: the review cites the submission's line numbers, whose text "
                       "this repository does not carry"),
    dict(paper=TERNGRAD, reviewer="R2", question="compare against 16-bit floats, not 32-bit (\"If you use then 4 bit for your gradient, you get a factor of 4\")",
         rows=(("fig08", "TernGrad's saving against fp16"), ("fig10", "fp16's error is negligible"),
               ("fig11", "TernGrad's saving against fp16 (paper quantizer, tgsim downlink; own-lr)")),
         note="bits to the same loss against fp16's, and fp16's rounding error"),
    dict(paper=TERNGRAD, reviewer="R3", question="the domain of the max in s = max(abs(g))",
         rows=(), note="notation, not an experiment: tgsim takes the max over one layer's elements "
                       "(docs/THEORY.md §1.1); fig02 compares it with one max for the whole model"),
    dict(paper=TERNGRAD, reviewer="R3", question="better convergence rate or probability? no rate analysis",
         rows=(("fig04", "TernGrad converges with Robbins-Monro steps"),
               ("fig09", "TernGrad keeps the linear speedup")),
         note="measured rates: the tail slope of ||w-w*||² on least squares, and iterations against workers"),
    dict(paper=TERNGRAD, reviewer="R3", question="the single-minimum (convex-like) assumption is too strong",
         rows=(("fig04", "TernGrad converges with Robbins-Monro steps"),
               ("fig03", "TernGrad as published (MAX sharing): within 1 point of fp32 at every N")),
         note="fig04 runs where the assumption holds (least squares); fig03 and fig08 run the non-convex "
              "convnet, where it does not, and report what happens there"),
    dict(paper=TERNGRAD, reviewer="R3", question="more metrics than accuracy",
         rows=(("fig08", "TernGrad needs fewer bits in total to reach the loss"),
               ("fig03", "MAX sharing collapses in the demo recipe (8 workers x 8 samples)"),
               ("fig11", "TernGrad needs fewer bits in total to reach the loss (paper quantizer, tgsim downlink; own-lr)")),
         note="bits to a loss target, training loss, scaler and dead-unit diagnostics, throughput (fig06)"),
    dict(paper=JIANG, reviewer="R1", question="variance at a given communication budget against prior art "
                                              "(Konečný & Richtárik, Suresh et al., Wangni et al.)",
         rows=(("fig07", "QSGD needs fewer bits than TernGrad for TernGrad's 2-bit variance"),
               ("fig07", "unbiased error falls as 1/N (different gradients per worker)")),
         note="every registered codec (Suresh et al. and random-k among them) at 1-16 bits per element"),
    dict(paper=JIANG, reviewer="R1", question="why is sparsification + quantization better than either alone",
         rows=(("fig08", "PQASGD needs 3-5 % of fp32's communication"),),
         note="PQASGD (TernGrad every 4 steps) against TernGrad and QSGD alone, in bits to the same loss"),
    dict(paper=JIANG, reviewer="R1", question="speedup against the compression ratio; P machines against 1",
         rows=(("fig09", "TernGrad keeps the linear speedup"), ("fig09", "PQASGD keeps the linear speedup")),
         note="fig09 (a)-(c) iterations against M, (d) against the compression ratio at a fixed M"),
    dict(paper=JIANG, reviewer="R1", question="were the learning rates tuned for every method and worker count?",
         rows=(("fig08", "TernGrad needs fewer bits in total to reach the loss (each method's tuned rate)"),
               ("fig11", "TernGrad needs fewer bits in total to reach the loss (paper quantizer, tgsim downlink; own-lr)"),
               ("fig11", "accuracy loss under 2 points (GoogLeNet's sentence) (paper quantizer, tgsim downlink; own-lr)")),
         note="partly: fig08 and fig11 run every method at fp32's tuned rate and at its own (tuned on a validation "
              "split at one worker count, N = 8 in fig11; never re-tuned per worker count); fig09 runs every method "
              "at fp32's rate at every M"),
    dict(paper=JIANG, reviewer="R1", question="show the linear speedup experimentally against prior art",
         rows=(("fig09", "fp32's linear range in M (where the other methods are judged)"),
               ("fig09", "TernGrad keeps the linear speedup"), ("fig09", "PQASGD keeps the linear speedup")),
         note="slopes over one common range of M, each against fp32's; one row per other codec in fig09"),
    dict(paper=JIANG, reviewer="R2", question="the proofs lack structure", rows=(),
         note="about the supplement's writing, not an experiment"),
    dict(paper=JIANG, reviewer="R2", question="total communication for a fixed error threshold",
         rows=(("fig08", "TernGrad needs fewer bits in total to reach the loss"),
               ("fig08", "PQASGD needs 3-5 % of fp32's communication")),
         note="bits up + down until the loss reaches 1.25x fp32's minimum"),
    dict(paper=JIANG, reviewer="R3", question="sparse parameter averaging is the same as communication-efficient distributed methods; cite them (e.g. elastic averaging SGD)",
         rows=(("fig09", "sparse parameter averaging keeps the linear speedup"),),
         note="the citation is for the paper; fig09 measures sparse parameter averaging (fp32, every 4 steps)"),
    dict(paper=JIANG, reviewer="R3", question="periodic parameter averaging may diverge; report accuracies",
         rows=(("fig08", "PQASGD's accuracy against fp32's"),
               ("fig08", "every method reaches fp32's loss target")),
         note="PQASGD's accuracy against fp32's at the common step (fp32's step budget), and the seeds that missed the target"),
    dict(paper=JIANG, reviewer="R4", question="can the quantization factor exceed √M (q grows with the dimension)?",
         rows=(("fig09", "qsgd[levels=8] keeps the linear speedup (Jiang & Agrawal's rate)"),
               ("fig09", "TernGrad keeps the linear speedup")),
         note="partly: one dimension (64) only; QSGD at the s = sqrt(d) = 8 levels the theorem needs against 2-bit "
              "TernGrad, each over the range of M where fp32 itself is linear; a sweep over the dimension is not run"),
    dict(paper=JIANG, reviewer="R4", question="how many bits does the O(1/√MK) rate need; how many are used?",
         rows=(("fig07", "QSGD needs fewer bits than TernGrad for TernGrad's 2-bit variance"),
               ("fig09", "qsgd[levels=8] keeps the linear speedup (Jiang & Agrawal's rate)")),
         note="fig09 (d) plots iterations against the measured bits of each level count; QSGD at s = sqrt(64) = 8 "
              "levels (its measured bits per element in fig09's rows) is the level count the rate needs here"),
    dict(paper=JIANG, reviewer="R4", question="networks faster than 1 Gb/s",
         rows=(("fig06", "the gain grows as the bandwidth falls"),
               ("fig11", "significant speed gains (paper quantizer, tgsim downlink; modeled, 1 Gb/s, against the "
                         "best float)"),
               ("fig11", "speedup on faster links (paper quantizer, tgsim downlink; modeled, 10 and 100 Gb/s)")),
         note="model only (fig06: 1 Gb/s Ethernet and 100 Gb/s InfiniBand; fig11: 10 and 100 Gb/s at the measured "
              "N); no measured fast link here"),
    dict(paper=JIANG, reviewer="R4", question="results on ImageNet", rows=(),
         note="cannot be answered at this scale (see the untestable claims)"),
    dict(paper=JIANG, reviewer="R4", question="the exact number of bits used for QSGD",
         rows=(("fig11", "QSGD's bits with the paper's coding (2, 4, 8-bit words)"),
               ("fig09", "qsgd[levels=8] keeps the linear speedup (Jiang & Agrawal's rate)")),
         note="measured from QSGD's payloads: fig11's row per level count and model, fig09's row at s = 8 levels "
              "(its bits up per element in the row); fig07 and fig09 (d) sweep QSGD's levels"),
    dict(paper=JIANG, reviewer="R4", question="\"Does QSGD also have requirements on the number of bits for their "
                                              "theory?\"",
         rows=(("fig09", "qsgd[levels=8] keeps the linear speedup (Jiang & Agrawal's rate)"),),
         note="unanswered: a question about QSGD's own theory, whose text was not at hand, so no row tests it. "
              "fig09 only measures QSGD's bits at the level count Jiang & Agrawal's condition asks for here "
              "(s = sqrt(d) = 8 levels at d = 64; the condition as tgsim reads it, paraphrase, " + UNCHECKED + ")"),
    dict(paper=JIANG, reviewer="R4", question="\"Will the proposed method still have improvement when smaller "
                                              "number of bits is used for QSGD?\"",
         rows=(("fig09", "PQASGD against fewer-bit QSGD (reviewer 4's question)"),),
         note="partly. Read as PQASGD against QSGD at fewer levels: fig09's row, at one M on least squares (PQASGD "
              "with TernGrad's quantizer against QSGD at 1-32767 levels), no verdict; the row names the QSGD level "
              "counts that need fewer iterations than PQASGD (at less compression). Read as PQASGD quantizing "
              "with fewer-bit QSGD itself: unanswered, no run exists (fig08 and fig09 run PQASGD with TernGrad's "
              "quantizer only, and fig10's 'TernGrad against 4-bit QSGD' compares the quantizers, not PQASGD). "
              "The runs that would answer it: " + R4_COMMAND),
]

UNTESTABLE = [
    untestable("AlexNet and GoogLeNet at the paper's scale lose no / under 2 % accuracy",
               '"applying TernGrad on AlexNet does not incur any accuracy loss and can even improve accuracy. '
               'The accuracy loss of GoogLeNet induced by TernGrad is less than 2% on average." (abstract)',
               "ImageNet-scale training is out of reach on this machine",
               "AlexNet / GoogLeNet on ImageNet with the paper's hyper-parameters, several seeds, TOST on the gap",
               setting="AlexNet and GoogLeNet (the abstract); ImageNet and fp32's hyper-parameters: paraphrase of the "
                       "paper's experiments, " + UNCHECKED),
    untestable("significant speed gains on a GPU cluster",
               '"Experiments show significant speed gains for various deep neural networks." (abstract)',
               "no GPU cluster; fig06 evaluates the performance model only",
               "measured throughput on 2-512 GPUs over 1 Gb/s Ethernet and 100 Gb/s InfiniBand",
               setting="paraphrase of the paper's experiments (GPU clusters, 4 GPUs per node; AlexNet, GoogLeNet, "
                       "VGG-A), " + UNCHECKED),
    untestable("PQASGD as fast as full-communication SGD in wall-clock time",
               words("pqasgd"),
               "the speed half needs a measured cluster; fig08 tests the communication half at this scale",
               "time to a loss target on a 1 Gb/s cluster, PQASGD against fp32, several seeds",
               setting="paraphrase of the paper's experiments (CIFAR-10 and speech recognition on a 1 Gb/s "
                       "cluster), " + UNCHECKED),
]
