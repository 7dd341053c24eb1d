"""Model descriptions for the performance model: parameters and compute per layer, time per batch.

    from tgsim.analysis.perfmodel_nets import NETS, get_net
    net = get_net("alexnet")      # Net(name, layers=(Layer(name, params, macs, kind), ...), ...)

Each `Net` lists its parameter tensors grouped per layer (weights + biases / BN of one layer), in
FORWARD order, with
  params   trainable elements of the layer (what crosses the wire)
  macs     forward multiply-accumulates per example (how long its backward pass takes, relative)
  kind     "conv" | "fc" (fully-connected / any dense matmul weight, incl. attention and embeddings)
  shapes   the layer's parameter tensors, in PyTorch's layout: a conv weight (c_out, c_in / groups, k, k),
           a dense weight (n_out, n_in), biases and BN/LayerNorm scale and shift (c,); their sizes sum to
           params. A codec whose bytes depend on a tensor's shape (PowerSGD's rank-r factors of the
           weight as a c_out x (c_in k k) matrix) is costed on them; () for a layer built without them
and the per-GPU time of one forward + backward pass of `batch` examples on paper-era GPUs.

Counts are computed here from the architectures, not typed in, and checked in the tests against
the published totals: AlexNet 60,965,224 (Krizhevsky et al. 2012, two-tower grouping, no LRN
params); VGG-A = VGG-11 132,863,336 (Simonyan & Zisserman 2015, config A); GoogLeNet (Inception v1,
Szegedy et al. 2015, Table 1, no auxiliary classifiers) 6,998,552; ResNet-50 25,557,032 (He et al.
2016, with BN scale/shift); BERT-base 109,482,240 (Devlin et al. 2019, with the pooler).

Compute time per batch, fp32, from soumith/convnet-benchmarks (README, "Imagenet Winners
Benchmarking", Titan X Maxwell, cuDNN R4 fp32 via Torch, forward + backward):
  AlexNet (One Weird Trick variant) batch 128: 27 + 53 = 81 ms
  VGG-A (OxfordNet model A) batch 64: 162 + 366 = 529 ms
  GoogLeNet V1 batch 128: 130 + 340 = 470 ms
ASSUMPTIONS (not measured here): time scales linearly with the batch; other GPUs scale by peak
fp32 throughput relative to the Titan X Maxwell (6.6 TFLOP/s boost): GTX 1080 8.9 -> x0.74,
Tesla P100 (SXM2) 10.6 -> x0.62 (real speedups are usually a bit smaller). ResNet-50 and BERT-base
have no row in that table: their time is estimated from forward MACs as 3 x MACs x 2 FLOP per
example at the mean effective rate the three measured CNNs reach on the Titan X by that count
(`effective_tflops()`, about 5 TFLOP/s: cuDNN's FFT/Winograd convolutions do fewer FLOPs than the
direct count). That is likely OPTIMISTIC for ResNet-50 (many small, memory-bound layers) and BERT;
treat both as order-of-magnitude.

A net measured elsewhere (a torch module's real parameter shapes and its forward + backward time on
this machine) comes from a JSON file: `net_from_file`.

Default per-GPU batch: AlexNet 128, GoogLeNet 64, VGG-A 32 (the TernGrad paper's Fig. 5 setting as
we recall it -- an assumption; pass batch= to change it), ResNet-50 64, BERT-base 32 sequences of
128 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TITANX_TFLOPS = 6.6
GPU_TFLOPS = {"titanx": 6.6, "gtx1080": 8.9, "p100": 10.6}


@dataclass(frozen=True)
class Layer:
    name: str
    params: int
    macs: int           # forward multiply-accumulates per example
    kind: str           # "conv" | "fc"
    shapes: tuple = ()  # the parameter tensors' shapes (their sizes sum to params); () where not given


@dataclass(frozen=True)
class Net:
    name: str
    layers: tuple[Layer, ...]
    batch: int                      # default per-GPU batch
    ref_ms: float                   # forward + backward ms of `ref_batch` examples on `ref_gpu`
    ref_batch: int
    ref_gpu: str = "titanx"
    fwd_frac: float = 1 / 3         # forward share of ref_ms (the rest is backward)
    source: str = ""
    unit: str = "images"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def params(self) -> int:
        return sum(l.params for l in self.layers)

    @property
    def macs(self) -> int:
        return sum(l.macs for l in self.layers)

    @property
    def fc_fraction(self) -> float:
        """Share of the parameters in fully-connected (dense matmul) layers."""
        return sum(l.params for l in self.layers if l.kind == "fc") / self.params

    def compute_seconds(self, gpu: str = "p100", batch: int | None = None) -> float:
        """Forward + backward seconds of one per-GPU batch on `gpu` (see the module's assumptions)."""
        b = self.batch if batch is None else batch
        return self.ref_ms / 1e3 * (b / self.ref_batch) * GPU_TFLOPS[self.ref_gpu] / GPU_TFLOPS[gpu]


def _conv(name, cin, cout, k, hout, groups=1, bias=True, bn=False):
    w = cout * (cin // groups) * k * k
    extra = (cout if bias else 0) + (2 * cout if bn else 0)
    shapes = ((cout, cin // groups, k, k),) + ((cout,),) * ((1 if bias else 0) + (2 if bn else 0))
    return Layer(name, w + extra, w * hout * hout, "conv", shapes)


def _fc(name, nin, nout, bias=True, macs_per_example=None):
    return Layer(name, nin * nout + (nout if bias else 0), nin * nout if macs_per_example is None else macs_per_example,
                 "fc", ((nout, nin),) + (((nout,),) if bias else ()))


def _group(name, parts, kind) -> Layer:
    """One layer of several parts (an inception module, a residual block): their params, MACs and shapes."""
    return Layer(name, sum(p.params for p in parts), sum(p.macs for p in parts), kind,
                 tuple(s for p in parts for s in p.shapes))


def alexnet() -> Net:
    layers = (
        _conv("conv1", 3, 96, 11, 55), _conv("conv2", 96, 256, 5, 27, groups=2), _conv("conv3", 256, 384, 3, 13),
        _conv("conv4", 384, 384, 3, 13, groups=2), _conv("conv5", 384, 256, 3, 13, groups=2),
        _fc("fc6", 256 * 6 * 6, 4096), _fc("fc7", 4096, 4096), _fc("fc8", 4096, 1000))
    return Net("alexnet", layers, batch=128, ref_ms=81.0, ref_batch=128, fwd_frac=27 / 81,
               source="convnet-benchmarks: AlexNet (OWT) b128 Titan X cuDNN R4 fp32 27+53 ms")


def vgg_a() -> Net:
    cfg = [(3, 64, 224), (64, 128, 112), (128, 256, 56), (256, 256, 56), (256, 512, 28), (512, 512, 28),
           (512, 512, 14), (512, 512, 14)]
    layers = tuple(_conv(f"conv{i + 1}", a, b, 3, h) for i, (a, b, h) in enumerate(cfg)) + (
        _fc("fc6", 512 * 7 * 7, 4096), _fc("fc7", 4096, 4096), _fc("fc8", 4096, 1000))
    return Net("vgg_a", layers, batch=32, ref_ms=529.0, ref_batch=64, fwd_frac=162 / 529,
               source="convnet-benchmarks: OxfordNet model A b64 Titan X cuDNN R4 fp32 162+366 ms")


_INCEPTION = [  # name, in, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj, spatial size
    ("3a", 192, 64, 96, 128, 16, 32, 32, 28), ("3b", 256, 128, 128, 192, 32, 96, 64, 28),
    ("4a", 480, 192, 96, 208, 16, 48, 64, 14), ("4b", 512, 160, 112, 224, 24, 64, 64, 14),
    ("4c", 512, 128, 128, 256, 24, 64, 64, 14), ("4d", 512, 112, 144, 288, 32, 64, 64, 14),
    ("4e", 528, 256, 160, 320, 32, 128, 128, 14), ("5a", 832, 256, 160, 320, 32, 128, 128, 7),
    ("5b", 832, 384, 192, 384, 48, 128, 128, 7)]


def googlenet() -> Net:
    layers = [_conv("conv1", 3, 64, 7, 112), _conv("conv2_reduce", 64, 64, 1, 56), _conv("conv2", 64, 192, 3, 56)]
    for name, cin, n1, r3, n3, r5, n5, pp, h in _INCEPTION:
        parts = [_conv("1x1", cin, n1, 1, h), _conv("3x3_reduce", cin, r3, 1, h), _conv("3x3", r3, n3, 3, h),
                 _conv("5x5_reduce", cin, r5, 1, h), _conv("5x5", r5, n5, 5, h), _conv("pool_proj", cin, pp, 1, h)]
        layers.append(_group(f"inception_{name}", parts, "conv"))
    layers.append(_fc("fc", 1024, 1000))
    return Net("googlenet", tuple(layers), batch=64, ref_ms=470.0, ref_batch=128, fwd_frac=130 / 470,
               source="convnet-benchmarks: GoogLeNet V1 b128 Titan X cuDNN R4 fp32 130+340 ms")


def effective_tflops() -> float:
    """Effective training FLOP/s on the Titan X of the three measured CNNs (3 x fwd MACs x 2 / time)."""
    nets = (alexnet(), vgg_a(), googlenet())
    rates = [3 * 2 * n.macs * n.ref_batch / (n.ref_ms / 1e3) for n in nets]
    return sum(rates) / len(rates) / 1e12


def _estimated(name, layers, batch, source, unit="images") -> Net:
    macs = sum(l.macs for l in layers)
    ms = 3 * 2 * macs * batch / (effective_tflops() * 1e12) * 1e3
    return Net(name, tuple(layers), batch=batch, ref_ms=ms, ref_batch=batch, source=source, unit=unit,
               notes=("compute time ESTIMATED from MACs at the CNNs' effective Titan X FLOP rate",))


def resnet50() -> Net:
    layers = [_conv("conv1", 3, 64, 7, 112, bias=False, bn=True)]
    cin = 64
    for stage, (blocks, width, h) in enumerate([(3, 64, 56), (4, 128, 28), (6, 256, 14), (3, 512, 7)]):
        for b in range(blocks):
            parts = [_conv("a", cin, width, 1, h, bias=False, bn=True), _conv("b", width, width, 3, h, bias=False, bn=True),
                     _conv("c", width, 4 * width, 1, h, bias=False, bn=True)]
            if b == 0:
                parts.append(_conv("down", cin, 4 * width, 1, h, bias=False, bn=True))
            layers.append(_group(f"res{stage + 2}{chr(97 + b)}", parts, "conv"))
            cin = 4 * width
    layers.append(_fc("fc", 2048, 1000))
    return _estimated("resnet50", layers, 64, "estimated from 4.1 GMACs/image (no convnet-benchmarks row)")


def bert_base(seq: int = 128) -> Net:
    h, ff, vocab = 768, 3072, 30522
    emb = vocab * h + 512 * h + 2 * h + 2 * h          # word + position + token type + LayerNorm
    layers = [Layer("embeddings", emb, 0, "fc", ((vocab, h), (512, h), (2, h), (h,), (h,)))]
    for i in range(12):
        attn = 4 * (h * h + h) + 2 * h
        ffn = h * ff + ff + ff * h + h + 2 * h
        macs = seq * (4 * h * h + 2 * h * ff) + 2 * seq * seq * h
        shapes = ((h, h), (h,)) * 4 + ((h,), (h,), (ff, h), (ff,), (h, ff), (h,), (h,), (h,))
        layers.append(Layer(f"layer{i}", attn + ffn, macs, "fc", shapes))
    layers.append(Layer("pooler", h * h + h, h * h, "fc", ((h, h), (h,))))
    return _estimated("bert_base", layers, 32, f"estimated from MACs, sequence length {seq}", unit="sequences")


def net_from_file(path) -> Net:
    """A Net from a JSON file describing a model measured elsewhere (e.g. a torch module's parameters
    and its forward + backward time on this machine):

        {"name": str, "batch": int (per-device batch of the measurement),
         "seconds": float (measured forward + backward seconds of one such batch),
         "fwd_frac": float in (0, 1) (optional, default 1/3), "source": str (where it was measured),
         "layers": [{"name": str, "shapes": [[int, ...], ...], "macs": int (optional), "kind": str}]}

    One Layer per entry, in FORWARD order: params = the sum of the shapes' sizes; macs absent: the
    layer's params (the backward time is then split over the layers by parameter count, an
    assumption); kind absent: "conv" for a 4-D weight, else "fc". The time is stored as the net's
    P100-row time (ref_gpu "p100", ref_batch = batch), so `compute_seconds("p100")` returns the measured
    seconds unchanged (scaled linearly with the batch). ValueError naming the file and the field at fault."""
    import json
    import math
    from pathlib import Path

    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"net file {path}: cannot read it as JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"net file {path}: the top level must be an object")
    for key in ("name", "batch", "seconds", "layers"):
        if key not in d:
            raise ValueError(f"net file {path}: missing field {key!r}")
    batch, seconds, frac = d["batch"], d["seconds"], d.get("fwd_frac", 1 / 3)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"net file {path}: batch must be an integer >= 1, got {batch!r}")
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"net file {path}: seconds must be a finite number > 0, got {seconds!r}")
    if not isinstance(frac, (int, float)) or not 0 < frac < 1:
        raise ValueError(f"net file {path}: fwd_frac must be in (0, 1), got {frac!r}")
    if not isinstance(d["layers"], list) or not d["layers"]:
        raise ValueError(f"net file {path}: layers must be a non-empty list")
    layers = []
    for i, layer in enumerate(d["layers"]):
        shapes = layer.get("shapes") if isinstance(layer, dict) else None
        if not isinstance(shapes, list) or not shapes or not all(
                isinstance(s, list) and s and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in s)
                for s in shapes):
            raise ValueError(f"net file {path}: layer {i} needs shapes, a non-empty list of lists of integers >= 1, "
                             f"got {shapes!r}")
        params = sum(math.prod(s) for s in shapes)
        macs = layer.get("macs", params)
        if isinstance(macs, bool) or not isinstance(macs, int) or macs < 0:
            raise ValueError(f"net file {path}: layer {i} macs must be an integer >= 0, got {macs!r}")
        kind = layer.get("kind", "conv" if any(len(s) == 4 for s in shapes) else "fc")
        if kind not in ("conv", "fc"):
            raise ValueError(f"net file {path}: layer {i} kind must be 'conv' or 'fc', got {kind!r}")
        layers.append(Layer(str(layer.get("name", f"layer{i}")), params, macs, kind, tuple(tuple(s) for s in shapes)))
    if not sum(l.macs for l in layers):
        raise ValueError(f"net file {path}: the layers' macs sum to 0 (the backward pass cannot be split over them)")
    return Net(str(d["name"]), tuple(layers), batch=batch, ref_ms=1e3 * float(seconds), ref_batch=batch,
               ref_gpu="p100", fwd_frac=float(frac), source=str(d.get("source", f"measured ({path.name})")),
               unit=str(d.get("unit", "examples")), notes=("compute time MEASURED (net file)",))


NETS = {"alexnet": alexnet, "googlenet": googlenet, "vgg_a": vgg_a, "resnet50": resnet50, "bert_base": bert_base}


def get_net(name: str) -> Net:
    try:
        return NETS[name]()
    except KeyError:
        raise ValueError(f"unknown net {name!r}; choose from {sorted(NETS)}") from None


__all__ = ["GPU_TFLOPS", "Layer", "NETS", "Net", "alexnet", "bert_base", "effective_tflops", "get_net", "googlenet",
           "net_from_file", "resnet50", "vgg_a"]
