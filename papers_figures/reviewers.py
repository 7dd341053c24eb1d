"""The reviewers' questions of both papers and the claims out of reach at this scale, as tables that
`make_report.py` renders into REPORT.md.

QUESTIONS: one row per question of the public reviews (TernGrad, NIPS 2017, paper 970; Jiang &
Agrawal, NeurIPS 2018, paper 1261), each the reviewer's point in a few words (paraphrased), and
what answers it: `rows`, a tuple of (figure prefix, claim name) pairs that must exist in the
figures' claims tables (make_report marks a missing one), and `note`, the answer's reading or why
the question cannot be answered at this scale.

UNTESTABLE: the papers' claims this repository cannot test at its scale, as `_theme.untestable` rows
(verdict "untestable here", with what would test them).
"""

from __future__ import annotations

from _theme import untestable

TERNGRAD = "Wen et al. 2017 (TernGrad)"
JIANG = "Jiang & Agrawal 2018"

QUESTIONS = [
    dict(paper=TERNGRAD, reviewer="R1", question="elaborate the choices made in layer-wise ternarizing",
         rows=(("fig02", "one scaler per layer narrows the gap (whole model)"),
               ("fig10", "one scaler per layer lowers the error (MLP, clipping 2.5σ)")),
         note="the gap on the convnet; on an MLP over seeds the error incl. the bias of clipping, with and "
              "without clipping"),
    dict(paper=TERNGRAD, reviewer="R1", question="an analysis of lines 168-169 and their trade-offs",
         rows=(), note="cannot be answered here: the review cites the submission's line numbers, whose text "
                       "this repository does not carry"),
    dict(paper=TERNGRAD, reviewer="R2", question="compare against 16-bit floats, not 32-bit (a 4x, not 16x, saving)",
         rows=(("fig08", "TernGrad's saving against fp16"), ("fig10", "fp16's error is negligible"),
               ("fig11", "TernGrad's saving against fp16 (paper recipe; own-lr)")),
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
               ("fig03", "terngrad, max: within 1 point of fp32 at every N")),
         note="fig04 runs where the assumption holds (least squares); fig03 and fig08 run the non-convex "
              "convnet, where it does not, and report what happens there"),
    dict(paper=TERNGRAD, reviewer="R3", question="more metrics than accuracy",
         rows=(("fig08", "TernGrad needs fewer bits in total to reach the loss"),
               ("fig03", "MAX sharing collapses in the demo recipe (8 workers x 8 samples)"),
               ("fig11", "TernGrad needs fewer bits in total to reach the loss (paper recipe; own-lr)")),
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
         note="fig09 (a) iterations against M, (b) against the compression ratio at a fixed M"),
    dict(paper=JIANG, reviewer="R1", question="were the learning rates tuned for every method and worker count?",
         rows=(("fig08", "TernGrad needs fewer bits in total to reach the loss (each method's tuned rate)"),
               ("fig11", "TernGrad loses under 2 points of accuracy (paper recipe; own-lr)")),
         note="every method at fp32's tuned rate and at its own (tuned on a validation split at one M; "
              "not re-tuned per worker count)"),
    dict(paper=JIANG, reviewer="R1", question="show the linear speedup experimentally against prior art",
         rows=(("fig09", "fp32 has linear speedup in M"), ("fig09", "TernGrad keeps the linear speedup"),
               ("fig09", "PQASGD keeps the linear speedup")),
         note="slopes over one common range of M, each against fp32's; one row per other codec in fig09"),
    dict(paper=JIANG, reviewer="R2", question="the proofs lack structure", rows=(),
         note="about the supplement's writing, not an experiment"),
    dict(paper=JIANG, reviewer="R2", question="total communication for a fixed error threshold",
         rows=(("fig08", "TernGrad needs fewer bits in total to reach the loss"),
               ("fig08", "PQASGD needs 3-5 % of fp32's communication")),
         note="bits up + down until the loss reaches 1.25x fp32's minimum"),
    dict(paper=JIANG, reviewer="R3", question="sparse parameter averaging is elastic-averaging-like; cite it",
         rows=(), note="about citations, not an experiment"),
    dict(paper=JIANG, reviewer="R3", question="periodic parameter averaging may diverge; report accuracies",
         rows=(("fig08", "PQASGD's accuracy against fp32's"),
               ("fig08", "every method reaches fp32's loss target")),
         note="PQASGD's accuracy against fp32's (each at its own stopping step), and the seeds that missed the target"),
    dict(paper=JIANG, reviewer="R4", question="can the quantization factor exceed √M (q grows with the dimension)?",
         rows=(("fig09", "TernGrad keeps the linear speedup"),),
         note="partly: one dimension (64) only, one row per codec in fig09; a sweep over the dimension is not run"),
    dict(paper=JIANG, reviewer="R4", question="how many bits does the O(1/√MK) rate need; how many are used?",
         rows=(("fig07", "QSGD needs fewer bits than TernGrad for TernGrad's 2-bit variance"),),
         note="fig09 (b) plots iterations against the measured bits of each level count"),
    dict(paper=JIANG, reviewer="R4", question="networks faster than 1 Gb/s",
         rows=(("fig06", "the gain grows as the bandwidth falls"),
               ("fig11", "significant speed gains (paper recipe; modeled, 1 Gb/s)")),
         note="model only (fig06: 1 Gb/s Ethernet and 100 Gb/s InfiniBand); no measured fast link here"),
    dict(paper=JIANG, reviewer="R4", question="results on ImageNet", rows=(),
         note="cannot be answered at this scale (see the untestable claims)"),
    dict(paper=JIANG, reviewer="R4", question="QSGD's number of bits; fewer bits for QSGD",
         rows=(("fig10", "TernGrad against 4-bit QSGD at N = 1"),
               ("fig11", "QSGD's bits with the paper's coding (2, 4, 8-bit words)")),
         note="fig07 and fig09 (b) sweep QSGD's levels; the bits are measured from its payloads"),
]

UNTESTABLE = [
    untestable("AlexNet and GoogLeNet on ImageNet lose no / under 2 % accuracy",
               '"applying TernGrad on AlexNet does not incur any accuracy loss and can even improve accuracy. '
               'The accuracy loss of GoogLeNet induced by TernGrad is less than 2% on average." (abstract)',
               "ImageNet-scale training is out of reach on this machine",
               "AlexNet / GoogLeNet on ImageNet with the paper's hyper-parameters, several seeds, TOST on the gap",
               setting="ImageNet, AlexNet and GoogLeNet, fp32's hyper-parameters"),
    untestable("significant speed gains on a GPU cluster",
               '"Experiments show significant speed gains for various deep neural networks." (abstract)',
               "no GPU cluster; fig06 evaluates the performance model only",
               "measured throughput on 2-512 GPUs over 1 Gb/s Ethernet and 100 Gb/s InfiniBand",
               setting="GPU clusters (4 GPUs per node), AlexNet, GoogLeNet, VGG-A"),
    untestable("sparse parameter averaging keeps the O(1/√MK) rate",
               '"We show that $O(1/\\sqrt{MK})$ convergence rate can be achieved if the sparsification and '
               'quantization hyperparameters are configured properly." (abstract, LaTeX as on papers.nips.cc)',
               "sparse parameter averaging (local SGD, Q = identity in tgsim/train/local_sgd.py) is implemented "
               "but not among the methods the figures' compare runs sweep",
               "`tgsim compare speedup` with fp32 local steps every p steps as a method: its slope over the "
               "common range of M against fp32's (tgsim.analysis.verdicts.slopes_common_range)",
               setting="non-convex, L-smooth objectives; CIFAR-10 and speech experiments"),
    untestable("PQASGD as fast as full-communication SGD in wall-clock time",
               '"our PQASGD can converge as fast as full-communication SGD with only 3%-5% communication data '
               'size." (abstract)',
               "the speed half needs a measured cluster; fig08 tests the communication half at this scale",
               "time to a loss target on a 1 Gb/s cluster, PQASGD against fp32, several seeds",
               setting="CIFAR-10 and speech recognition on a 1 Gb/s cluster"),
]
