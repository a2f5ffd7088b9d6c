"""A deployed Keras system for the Keras front-end tests: builds models, runs them, writes its own truth, waits.

    python keras_target.py OUTDIR [models|nomodel|fakeversion|fork]

Runs in the TF environment (tools/tf-venv.sh), never zen's. `models` builds a Sequential CNN (trained one step with
Adam, so BatchNormalization statistics move and the optimizer has slots), a functional model with branches and a
shared layer, and a subclassed transformer block with a layer holding variables of many dtypes. truth.json records
each model's id, its layers and configuration, and every variable (Keras path, dtype, shape, sha256 of its bytes) in
`model.variables` order, plus the optimizer's variables. `nomodel` imports TF and keeps tensors and variables but
no layer; `fakeversion` is `models` with `tensorflow.__version__` set to a release zen has no profile for.
`models` also builds keras.applications.MobileNetV2 (random weights, no download) and a functional model nesting
a Sequential and another functional model (one of whose layers got an initializer object, so Keras kept no
constructor arguments for it). `fork` builds only a customised
Block (a subclass whose `call` adds a residual and a scaled head, with one extra layer): the fork attributed to its
base. Every model's input and the output `model(x)` gave are written to NAME-inputs.safetensors and
NAME-outputs.safetensors (key "x"), the ground truth for reuse. For models holding layers whose class is defined
here (Block, ForkBlock, DTypes), truth.json's `dataflow` lists which sublayer's output feeds which call (and the
call's output), traced in an eager run of each such layer's `call`: the ground truth for data flow from bytecode.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import struct
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402

keras.utils.set_random_seed(7)
CONFIG = ("filters", "kernel_size", "strides", "padding", "units", "epsilon", "momentum", "input_dim", "output_dim",
          "axis", "rate", "use_bias")  # fmt: skip


ST = {"float32": "F32", "float64": "F64", "int64": "I64", "int32": "I32"}


def save_safetensors(path: str, arrays: dict) -> None:
    """A safetensors file written with numpy alone (the format: u64 header length, JSON header, raw data)."""
    header, blobs, off = {}, [], 0
    for key, a in sorted(arrays.items()):
        a = np.ascontiguousarray(a)
        header[key] = {"dtype": ST[str(a.dtype)], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def var_truth(v) -> dict:
    arr = v.value.numpy() if hasattr(v, "value") else v.numpy()
    return {"path": v.path, "dtype": str(v.dtype), "shape": list(v.shape), "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
            "trainable": bool(v.trainable), "id": id(v)}  # fmt: skip


def layer_truth(model) -> list[dict]:
    out = []
    for layer in model._flatten_layers(include_self=True):
        cfg = {k: repr(getattr(layer, k)) for k in CONFIG if hasattr(layer, k) and not callable(getattr(layer, k))}
        out.append({"name": layer.name, "class": f"{type(layer).__module__}.{type(layer).__qualname__}", "id": id(layer),
                    "config": cfg, "n_sublayers": len(layer._layers)})  # fmt: skip
    return out


class DTypes(layers.Layer):
    """Variables of every dtype a Keras layer can hold, with random contents (bit patterns, not only values)."""

    def build(self, input_shape):
        rng = np.random.default_rng(3)
        for name in ("float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"):
            w = self.add_weight(shape=(3, 5), dtype=name, trainable=False, name=f"t_{name}", initializer="zeros")
            if name == "bool":
                w.assign(rng.integers(0, 2, (3, 5)) > 0)
            elif name in ("float16", "bfloat16"):
                bits = rng.integers(0, 1 << 14, (3, 5)).astype(np.uint16)  # finite bit patterns
                w.assign(tf.bitcast(tf.constant(bits), tf.as_dtype(name)))
            else:
                w.assign(rng.integers(-100 if not name.startswith("u") else 0, 100, (3, 5)).astype(name))

    def call(self, x):
        return x


class Block(keras.Model):
    """A subclassed transformer block with its own call."""

    def __init__(self, vocab=50, dim=16, heads=2, **kw):
        super().__init__(**kw)
        self.emb = layers.Embedding(vocab, dim, name="emb")
        self.mha = layers.MultiHeadAttention(heads, dim // heads, name="mha")
        self.norm1 = layers.LayerNormalization(epsilon=1e-5, name="norm1")
        self.ff = [layers.Dense(32, activation="gelu", name="ff_in"), layers.Dense(dim, name="ff_out")]
        self.norm2 = layers.LayerNormalization(name="norm2")
        self.tables = DTypes(name="tables")
        self.head = layers.Dense(vocab, name="head")

    def call(self, ids):
        h = self.emb(ids)
        h = self.norm1(h + self.mha(h, h))
        f = h
        for d in self.ff:
            f = d(f)
        h = self.tables(self.norm2(h + f))
        return self.head(h)


class ForkBlock(Block):
    """A customised fork of Block: an extra projection layer and a changed call (residual, scaled head)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.proj = layers.Dense(16, activation="tanh", name="proj")

    def call(self, ids):
        h = self.emb(ids)
        h = self.norm1(h + self.mha(h, h))
        f = h
        for d in self.ff:
            f = d(f)
        h = self.tables(self.norm2(h + f)) + self.proj(h)
        return self.head(h) * 0.5


def _paths(layer, path: str = "") -> list[tuple[str, object]]:
    """(MR path, layer) for a layer and its sublayers: names joined by "." below the root, as zen's paths are."""
    out = [(path, layer)]
    for c in layer._layers:
        out += _paths(c, f"{path}.{c.name}" if path else c.name)
    return out


def _tensors(value) -> list:
    return [t for t in tf.nest.flatten(value) if tf.is_tensor(t)]


def _call_dataflow(layer, path: str, args: tuple) -> set[tuple[str, str]]:
    """Which of `layer`'s direct sublayers' outputs (and its own inputs) feed which sublayer call and its output, in an
    eager run of its `call`: every sublayer's output is made a fresh, watched tensor computed from gradient-stopped
    inputs, so a gradient from a call's arguments to an earlier output exists exactly when that output reaches the
    arguments without passing through another sublayer (integer inputs, which have no gradient, by identity)."""
    kids = {id(c): f"{path}.{c.name}" if path else c.name for c in layer._layers}
    base = path or "<root>"
    params = [p for p in inspect.signature(type(layer).call).parameters][1:]
    edges: set[tuple[str, str]] = set()
    sources: list[tuple[str, object]] = []
    orig = keras.layers.Layer.__call__

    def feeds(tape, consumer: str, value) -> None:
        flat = _tensors(value)
        floats = [t for t in flat if t.dtype.is_floating]
        with tape.stop_recording():
            for name, src in sources:
                direct = any(t is src for t in flat)
                if direct or (floats and src.dtype.is_floating and tape.gradient(floats, src) is not None):
                    edges.add((name, consumer))

    with tf.GradientTape(persistent=True) as tape:
        inputs = [tf.convert_to_tensor(a) if not tf.is_tensor(a) else a for a in args]
        for p, a in zip(params, inputs):
            if a.dtype.is_floating:
                tape.watch(a)
            sources.append((f"{base}:in:{p}", a))

        def wrapped(self, *a, **kw):
            if id(self) not in kids:
                return orig(self, *a, **kw)
            feeds(tape, kids[id(self)], (a, kw))
            a, kw = tf.nest.map_structure(lambda t: tf.stop_gradient(t) if tf.is_tensor(t) else t, (a, kw))
            y = tf.identity(orig(self, *a, **kw))
            tape.watch(y)
            sources.append((kids[id(self)], y))
            return y

        keras.layers.Layer.__call__ = wrapped
        try:
            out = type(layer).call(layer, *inputs)
        finally:
            keras.layers.Layer.__call__ = orig
        feeds(tape, f"{base}:out", out)
    return edges


def dataflow_truth(model, x) -> dict:
    """Data-flow ground truth of every layer of `model` whose class is defined here (subclassed models and layers):
    each is traced on the arguments it got in a normal call of the model."""
    scopes = [(p, la) for p, la in _paths(model) if type(la).__module__ == __name__]
    got: dict[int, tuple] = {}
    orig = keras.layers.Layer.__call__

    def record(self, *a, **kw):
        got.setdefault(id(self), a)
        return orig(self, *a, **kw)

    keras.layers.Layer.__call__ = record
    try:
        model(x)
    finally:
        keras.layers.Layer.__call__ = orig
    edges: set[tuple[str, str]] = set()
    for path, la in scopes:
        edges |= _call_dataflow(la, path, got[id(la)])
    return {"scopes": [p for p, _ in scopes], "edges": sorted(edges)}


def build_fork() -> dict:
    fork = ForkBlock(name="fork")
    ids = np.random.default_rng(4).integers(0, 50, size=(2, 7))
    fork(ids)
    return {"fork": (fork, ids)}


def build_models() -> dict:
    seq = keras.Sequential([
        keras.Input((12, 12, 3)), layers.Conv2D(8, 3, strides=1, padding="same", name="conv1"),
        layers.BatchNormalization(name="bn1"), layers.ReLU(name="relu1"), layers.Conv2D(4, 3, strides=2, name="conv2"),
        layers.Flatten(name="flat"), layers.Dropout(0.25, name="drop"), layers.Dense(5, name="fc"),
    ], name="cnn")  # fmt: skip
    seq.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    x = np.random.default_rng(1).normal(size=(4, 12, 12, 3)).astype("float32")
    seq.fit(x, np.ones((4, 5), "float32"), epochs=1, batch_size=4, verbose=0)

    inp = keras.Input((10,), name="features")
    shared = layers.Dense(10, activation="relu", name="shared")
    a = shared(inp)
    b = layers.Dense(10, name="side")(inp)
    b = shared(b)
    c = layers.Concatenate(name="cat")([a, b])
    c = layers.BatchNormalization(name="bn")(c)
    out = layers.Dense(3, name="out")(layers.Add(name="add")([c, layers.Dense(20, name="skip")(inp)]))
    func = keras.Model(inp, out, name="branches")

    block = Block(name="block")
    ids = np.random.default_rng(2).integers(0, 50, size=(2, 7))
    block(ids)
    inner = keras.Sequential([layers.Dense(6, activation="relu", name="i1"), layers.Dense(6, name="i2")], name="inner")
    nin = keras.Input((5,), name="nin")
    h = inner(nin)
    sub_in = keras.Input((6,), name="sub_in")
    sub = keras.Model(
        sub_in,
        layers.Dense(4, activation="sigmoid", kernel_initializer=keras.initializers.HeNormal(seed=1), name="s1")(sub_in),
        name="sub",
    )
    nested = keras.Model(nin, layers.Dense(2, name="nout")(layers.Concatenate(name="ncat")([sub(h), h])), name="nested")

    mobile = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    xm = np.random.default_rng(5).normal(size=(2, 32, 32, 3)).astype("float32")
    return {"cnn": (seq, x[:1]), "branches": (func, np.random.default_rng(6).normal(size=(2, 10)).astype("float32")),
            "block": (block, ids), "mobilenet": (mobile, xm),
            "nested": (nested, np.random.default_rng(8).normal(size=(3, 5)).astype("float32"))}  # fmt: skip


def main() -> None:
    outdir, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "models")
    truth: dict = {"tensorflow": tf.__version__, "keras": keras.__version__, "pid": os.getpid(), "mode": mode}
    keep = []
    if mode == "nomodel":
        keep = [tf.constant(np.arange(100, dtype="float32")), tf.Variable(np.ones((4, 4), "float64")),
                keras.Variable(np.zeros((3,), "float32"), name="loose")]  # fmt: skip
        truth["models"] = {}
    else:
        models = build_fork() if mode == "fork" else build_models()
        truth["models"] = {}
        for name, (m, x) in models.items():
            y = m(x)
            save_safetensors(os.path.join(outdir, f"{name}-inputs.safetensors"), {"x": np.asarray(x)})
            save_safetensors(os.path.join(outdir, f"{name}-outputs.safetensors"), {"x": np.asarray(y)})
            entry = {"id": id(m), "class": f"{type(m).__module__}.{type(m).__qualname__}", "layers": layer_truth(m),
                     "variables": [var_truth(v) for v in m.variables],
                     "output_sha256": hashlib.sha256(np.asarray(y).tobytes()).hexdigest()}  # fmt: skip
            graph = getattr(m, "_functional", None) or m  # a Sequential's graph is its functional twin
            if hasattr(graph, "_nodes_by_depth"):
                entry["edges"] = sorted({(p.operation.name, n.operation.name) for nodes in graph._nodes_by_depth.values()
                                         for n in nodes for p in n.parent_nodes})  # fmt: skip
            if any(type(la).__module__ == __name__ for _, la in _paths(m)):
                entry["dataflow"] = dataflow_truth(m, x)
            opt = getattr(m, "optimizer", None)
            entry["optimizer"] = [var_truth(v) for v in opt.variables] if opt is not None and opt.built else []
            truth["models"][name] = entry
        keep = list(models.values())
        if mode == "fakeversion":
            tf.__version__ = "2.99.0"
            truth["tensorflow"] = tf.__version__
    with open(os.path.join(outdir, "truth.json"), "w") as fh:
        json.dump(truth, fh, indent=1)
    print("READY", flush=True)
    sys.stdin.read()
    del keep


if __name__ == "__main__":
    main()
