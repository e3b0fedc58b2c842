#!/usr/bin/env python3
"""ONNX fixtures for cohort's ONNX reader (tests/test_onnx.c).

Usage: onnx_golden.py OUT_DIR

Needs python3-torch and python3-onnx; exits 77 (the caller skips) if either
is missing. Every file that must load is checked with
onnx.checker.check_model first. Writes into OUT_DIR:

  cnn13.onnx, cnn17.onnx  a small CNN (Conv, BatchNorm2d, ReLU, MaxPool2d,
                 a grouped strided Conv, Flatten, Linear; seed 0; input
                 (1, 3, 8, 8)) exported by torch.onnx.export in TRAINING
                 mode, do_constant_folding=False, opset 13 and 17
  cnn13.txt, cnn17.txt  what onnx's Python API reads from each, one fact a
                 line: "opset V", "input NAME D0 D1 ..." (-1 for symbolic),
                 "output NAME D0 ...", "node OP_TYPE" (in order),
                 "init NAME" (in order), "attr NODE_INDEX NAME TYPE VALUES..."
                 for the Conv nodes' ints/int attributes
  cnn13.safetensors, cnn17.safetensors  the PyTorch state dict right after
                 each export (tests/golden/nn_golden_util.py's format; the
                 export's traced training forward moves the BN buffers), the
                 reference the initializers must equal bit for bit
  cnn13_inputs.onnx  the same export with keep_initializers_as_inputs=True
                 (every initializer also a graph input, as older exporters)
  dtypes.onnx    onnx.helper-made: initializers of every converted type
                 (float16 raw and in int32_data with subnormals, -0, inf and
                 NaN; bfloat16 raw; double raw and in double_data; int32,
                 int16, int8, uint8, bool, uint32, int64), a Constant node
                 whose TENSOR attribute is a double tensor, and a node of a
                 custom domain carrying one attribute of each kind
  dtypes.safetensors  the expected converted values (float32 / int64, from
                 numpy's conversions), "const" for the Constant's value
  bad_random.onnx  4096 random bytes (seed 1)
  bad_pth.onnx   a torch.save'd state dict (zip)
  bad_truncated.onnx  cnn13.onnx cut at half its size
  bad_missing_init.onnx  cnn13.onnx with initializer "0.weight" removed
  bad_opset7.onnx  cnn13.onnx with its default-domain opset set to 7
  bad_external.onnx (+ bad_external.data)  cnn13.onnx saved with every
                 tensor as external data
  bad_dup_output.onnx  two nodes writing the same name
  bad_no_output.onnx   a graph without outputs
  bad_int_input.onnx   a graph input of element type int64
  bad_raw_len.onnx     a float initializer whose raw_data is 2 bytes short
  bad_dup_init.onnx    two initializers named W
  bad_neg_dim.onnx     an initializer with dims [-1, 3]
  bad_out_unknown.onnx a graph output nothing produces
"""
import os
import random
import struct
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import torch
    import torch.nn as nn
except ImportError as e:  # the C test skips with this reason
    print("onnx_golden.py: %s" % e, file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

np.seterr(over="ignore")  # 1e300 -> float32 inf on purpose
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
torch.set_num_threads(1)


def P(name):
    return os.path.join(out, name)


def make_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2),
        nn.Flatten(),
        nn.Linear(8 * 2 * 2, 10),
    )


model = make_cnn()
with torch.no_grad():  # buffers that are not the defaults
    model[1].running_mean.uniform_(-1, 1)
    model[1].running_var.uniform_(0.5, 2)


def describe(m, path):
    g = m.graph
    lines = []
    for os_ in m.opset_import:
        if os_.domain in ("", "ai.onnx"):
            lines.append("opset %d" % os_.version)
    inits = {t.name for t in g.initializer}

    def dims(vi):
        return " ".join(str(d.dim_value) if d.HasField("dim_value") else "-1"
                        for d in vi.type.tensor_type.shape.dim)
    for vi in g.input:
        if vi.name not in inits:
            lines.append("input %s %s" % (vi.name, dims(vi)))
    for vi in g.output:
        lines.append("output %s %s" % (vi.name, dims(vi)))
    for n in g.node:
        lines.append("node %s" % n.op_type)
    for t in g.initializer:
        lines.append("init %s" % t.name)
    for k, n in enumerate(g.node):
        if n.op_type != "Conv":
            continue
        for a in n.attribute:
            if a.type == onnx.AttributeProto.INTS:
                lines.append("attr %d %s ints %s" % (k, a.name, " ".join(str(v) for v in a.ints)))
            elif a.type == onnx.AttributeProto.INT:
                lines.append("attr %d %s int %d" % (k, a.name, a.i))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


for opset in (13, 17):
    path = P("cnn%d.onnx" % opset)
    torch.onnx.export(model, torch.zeros(1, 3, 8, 8), path,
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=opset,
                      input_names=["input"], output_names=["logits"])
    # the export traces one training-mode forward, which moves the BN
    # buffers: the file holds the state dict as it is after the export
    sd = model.state_dict()
    U.save(P("cnn%d.safetensors" % opset), {k: v for k, v in sd.items()})
    m = onnx.load(path)
    onnx.checker.check_model(m)
    describe(m, P("cnn%d.txt" % opset))

# an old-style export: every weight also listed as a graph input
torch.onnx.export(model, torch.zeros(1, 3, 8, 8), P("cnn13_inputs.onnx"),
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                  opset_version=13, input_names=["input"], output_names=["logits"],
                  keep_initializers_as_inputs=True)
m = onnx.load(P("cnn13_inputs.onnx"))
onnx.checker.check_model(m)
assert len(m.graph.input) == 1 + len(m.graph.initializer)

# ---------------------------------------------------------------- dtypes
f16_vals = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, 3e-5, np.inf, -np.inf, np.nan],
                    dtype=np.float16)
bf16_f32 = np.array([1.0, -3.140625, 1e-38, 3e38, -0.0, np.inf], dtype=np.float32)
bf16_bits = (bf16_f32.view(np.uint32) >> 16).astype(np.uint16)  # exact: low bits zero?
bf16_expect = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
dbl = np.array([[1.0 / 3.0, -1e-300], [1e300, 2.5]], dtype=np.float64)
i32 = np.array([-2147483648, -1, 0, 2147483647], dtype=np.int32)
i16 = np.array([-32768, 7, 32767], dtype=np.int16)
i8 = np.array([-128, -1, 127], dtype=np.int8)
u8 = np.array([0, 200, 255], dtype=np.uint8)
bl = np.array([True, False, True])
u32 = np.array([0, 4294967295], dtype=np.uint32)
i64 = np.array([-(2 ** 63), 2 ** 63 - 1, 5], dtype=np.int64)
f32 = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)

inits = [
    helper.make_tensor("f16_raw", TensorProto.FLOAT16, [10], f16_vals.tobytes(), raw=True),
    helper.make_tensor("f16_typed", TensorProto.FLOAT16, [2, 5], f16_vals.tolist()),  # -> int32_data bits
    helper.make_tensor("bf16_raw", TensorProto.BFLOAT16, [6], bf16_bits.tobytes(), raw=True),
    helper.make_tensor("f64_raw", TensorProto.DOUBLE, [2, 2], dbl.tobytes(), raw=True),
    helper.make_tensor("f64_typed", TensorProto.DOUBLE, [2, 2], dbl.flatten().tolist()),
    helper.make_tensor("f32_typed", TensorProto.FLOAT, [1, 3], f32.flatten().tolist()),
    helper.make_tensor("f32_raw", TensorProto.FLOAT, [1, 3], f32.tobytes(), raw=True),
    helper.make_tensor("i32_typed", TensorProto.INT32, [4], i32.tolist()),
    helper.make_tensor("i16_raw", TensorProto.INT16, [3], i16.tobytes(), raw=True),
    helper.make_tensor("i8_typed", TensorProto.INT8, [3], i8.tolist()),
    helper.make_tensor("u8_raw", TensorProto.UINT8, [3], u8.tobytes(), raw=True),
    helper.make_tensor("bool_typed", TensorProto.BOOL, [3], [int(b) for b in bl.tolist()]),  # ints: protobuf >= 4 (pip, with tensorboard) refuses bools
    helper.make_tensor("u32_raw", TensorProto.UINT32, [2], u32.tobytes(), raw=True),
    helper.make_tensor("i64_typed", TensorProto.INT64, [3], i64.tolist()),
    helper.make_tensor("i64_raw", TensorProto.INT64, [3], i64.tobytes(), raw=True),
    helper.make_tensor("scalar", TensorProto.FLOAT, [], [7.0]),
    helper.make_tensor("empty", TensorProto.FLOAT, [0, 3], []),
]
const_t = helper.make_tensor("", TensorProto.DOUBLE, [3], [0.1, -0.2, 1e40])
nodes = [
    helper.make_node("Constant", [], ["c"], name="const0", value=const_t),
    helper.make_node("Identity", ["X"], ["Y"], name="id0"),
    helper.make_node("Custom", ["X", "", "f32_raw"], ["Z"], name="custom0", domain="com.cohort.test",
                     af=0.25, ai=-3, as_="hello", at=helper.make_tensor("", TensorProto.FLOAT16, [2], [1.0, -2.0]),
                     afs=[1.0, 2.5], ais=[1, -2, 3], ass=["a", "bc"]),
]
g = helper.make_graph(nodes, "dtypes",
                      [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3]),
                       helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["M"]),
                       helper.make_tensor_value_info("c", TensorProto.DOUBLE, [3])],
                      initializer=inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("com.cohort.test", 1)],
                      producer_name="onnx_golden.py")
onnx.checker.check_model(m)
assert list(m.graph.initializer[1].int32_data) == f16_vals.view(np.uint16).astype(np.int32).tolist()
onnx.save(m, P("dtypes.onnx"))
T = torch.from_numpy
U.save(P("dtypes.safetensors"), {
    "f16_raw": T(f16_vals.astype(np.float32)),
    "f16_typed": T(f16_vals.astype(np.float32).reshape(2, 5)),
    "bf16_raw": T(bf16_expect),
    "f64_raw": T(dbl.astype(np.float32)),
    "f64_typed": T(dbl.astype(np.float32)),
    "f32_typed": T(f32), "f32_raw": T(f32),
    "i32_typed": T(i32.astype(np.int64)),
    "i16_raw": T(i16.astype(np.int64)),
    "i8_typed": T(i8.astype(np.int64)),
    "u8_raw": T(u8.astype(np.int64)),
    "bool_typed": T(bl.astype(np.int64)),
    "u32_raw": T(u32.astype(np.int64)),
    "i64_typed": T(i64), "i64_raw": T(i64),
    "scalar": torch.tensor(7.0), "empty": torch.zeros(0, 3),
    "const": T(np.array([0.1, -0.2, 1e40], dtype=np.float64).astype(np.float32)),
    "at": T(np.array([1.0, -2.0], dtype=np.float16).astype(np.float32)),
})

# ---------------------------------------------------------------- refused files
rng = random.Random(1)
with open(P("bad_random.onnx"), "wb") as f:
    f.write(bytes(rng.randrange(256) for _ in range(4096)))
torch.save(sd, P("bad_pth.onnx"))
with open(P("cnn13.onnx"), "rb") as f:
    good = f.read()
with open(P("bad_truncated.onnx"), "wb") as f:
    f.write(good[: len(good) // 2])

m = onnx.load(P("cnn13.onnx"))
for t in list(m.graph.initializer):
    if t.name == "0.weight":
        m.graph.initializer.remove(t)
onnx.save(m, P("bad_missing_init.onnx"))

m = onnx.load(P("cnn13.onnx"))
for os_ in m.opset_import:
    if os_.domain in ("", "ai.onnx"):
        os_.version = 7
onnx.save(m, P("bad_opset7.onnx"))

m = onnx.load(P("cnn13.onnx"))
if os.path.exists(P("bad_external.data")):
    os.remove(P("bad_external.data"))
onnx.save_model(m, P("bad_external.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                location="bad_external.data", size_threshold=0)


def small(nodes, inputs, outputs, inits=(), name=None):
    g = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(inits))
    mm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(mm, P(name))


X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3])
small([helper.make_node("Relu", ["X"], ["Y"], name="r0"), helper.make_node("Relu", ["X"], ["Y"], name="r1")],
      [X], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])], name="bad_dup_output.onnx")
small([helper.make_node("Relu", ["X"], ["Y"], name="r0")], [X], [], name="bad_no_output.onnx")
small([helper.make_node("Identity", ["X"], ["Y"], name="i0")],
      [helper.make_tensor_value_info("X", TensorProto.INT64, [1, 3])],
      [helper.make_tensor_value_info("Y", TensorProto.INT64, [1, 3])], name="bad_int_input.onnx")
w = helper.make_tensor("W", TensorProto.FLOAT, [3], b"\0" * 12, raw=True)
w.raw_data = b"\0" * 10
small([helper.make_node("Add", ["X", "W"], ["Y"], name="a0")], [X],
      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])], inits=[w], name="bad_raw_len.onnx")
small([helper.make_node("Add", ["X", "W"], ["Y"], name="a0")], [X],
      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])],
      inits=[helper.make_tensor("W", TensorProto.FLOAT, [3], [1, 2, 3]),
             helper.make_tensor("W", TensorProto.FLOAT, [3], [4, 5, 6])], name="bad_dup_init.onnx")
w = helper.make_tensor("W", TensorProto.FLOAT, [1, 3], [1, 2, 3])
w.dims[0] = -1
small([helper.make_node("Add", ["X", "W"], ["Y"], name="a0")], [X],
      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])], inits=[w], name="bad_neg_dim.onnx")
small([helper.make_node("Relu", ["X"], ["Y"], name="r0")], [X],
      [helper.make_tensor_value_info("Q", TensorProto.FLOAT, [1, 3])], name="bad_out_unknown.onnx")
