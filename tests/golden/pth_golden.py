#!/usr/bin/env python3
"""PyTorch .pth fixtures for cohort's .pth reader and writer (tests/test_pth).

  pth_golden.py OUTDIR
      Writes, with this torch (Debian's 1.13), for each fixture X.pth the
      tensors cohort must read from it as X.expect.safetensors (float
      tensors as float32, int64 kept, contiguous; written by hand:
      safetensors_golden.write_by_hand):
        resnet18_zip.pth, resnet18_legacy.pth  torchvision resnet18(num_classes=10),
                                 seed 0, one training forward (BN buffers move);
                                 zip and _use_new_zipfile_serialization=False;
                                 resnet18.safetensors holds the same weights (their
                                 expected tensors)
        noncontig_{zip,legacy}.pth  transposed, strided and offset views of
                                 shared storages, a 0-dim and an empty tensor
        dtypes.pth              float16 (subnormal, inf, nan), bfloat16, float64, int64
        param.pth               nn.Parameter values (_rebuild_parameter)
        (the checkpoints, ddp and whole_module: resnet_golden's smallcnn, 1 channel,
        10 classes, after one SGD step with momentum)
        ckpt_model.pth          {"epoch", "model": sd, "optimizer": SGD state dict}
        ckpt_state_dict.pth     {"state_dict": sd, "best_acc1": 0.5}
        ckpt_model_state_dict.pth {"model_state_dict": sd, "epoch": 2}
        ckpt_net.pth            {"net": sd, "epoch": 1} (needs model.weights_key = net)
        ddp.pth                 the resnet18 state dict, every key "module."-prefixed
        renamed_prefix.pth      a zip whose record prefix is not "archive"
      and the files that must be refused (no .expect): whole_module.pth
      (torch.save(model)), evil_system.pth / evil_system_legacy.pth (a
      pickle calling os.system), evil_eval.pth (builtins.eval); each would
      create OUTDIR/PWNED if it were executed; hand-made zips (ok_handmade.pth,
      a 2x2 float32 tensor of zero bytes, and bad_*.pth: each breaks one rule:
      a tensor outside its storage by offset, stride, declared numel or an
      overflowing stride, a 2^40-element stride-0 view (too big to
      gather), a negative stride, an int32 tensor, SETITEM on a
      list, APPEND on a dict, the INST opcode, a memo entry never stored, no
      STOP, a missing record, a compressed record).

  pth_golden.py --check-written PTH ARCH NUM_CLASSES IN_CHANNELS EXPECT
      torch.load(PTH, weights_only=True), load_state_dict(strict=True) into
      torchvision ARCH(num_classes), check names, dtypes, _metadata
      versions, and values against the safetensors file EXPECT.

  pth_golden.py --resnet50 OUTDIR
      resnet50_zip.pth and resnet50.safetensors (benchmark only).
Exit status: 0 ok, 1 error.
"""
import collections
import io
import os
import sys
import zipfile

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_golden  # noqa: E402


def expect(t):
    t = t.detach()
    if t.dtype.is_floating_point:
        t = t.float()
    return t.contiguous().clone()


def save(out, name, obj, state=None, legacy=False):
    path = os.path.join(out, name)
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    if state is not None:
        safetensors_golden.write_by_hand(path[:-4] + ".expect.safetensors",
                                         collections.OrderedDict(
                                             (k, expect(v)) for k, v in state.items()), {})


def resnet(arch, classes):
    torch.manual_seed(0)
    m = getattr(torchvision.models, arch)(num_classes=classes)
    m.train()
    with torch.no_grad():
        m(torch.randn(2, 3, 64, 64))
    return m


class Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def fixtures(out):
    m = resnet("resnet18", 10)
    sd = m.state_dict()
    save(out, "resnet18_zip.pth", sd)
    save(out, "resnet18_legacy.pth", sd, legacy=True)
    safetensors_golden.write_by_hand(os.path.join(out, "resnet18.safetensors"), sd,
                                     {"format": "pt"})

    base = torch.arange(60, dtype=torch.float32).reshape(6, 10) / 7
    nc = collections.OrderedDict()
    nc["transposed"] = base.t()
    nc["strided"] = base[1::2, 3:9:2]
    nc["offset"] = base[4]
    nc["scalar"] = base[2, 5]
    nc["empty"] = base[:, 10:]
    nc["expanded"] = torch.arange(3.0).reshape(3, 1).expand(3, 4)
    nc["long_t"] = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()
    for c in ("transposed", "strided", "expanded"):
        assert not nc[c].is_contiguous(), c
    save(out, "noncontig_zip.pth", nc, nc)
    save(out, "noncontig_legacy.pth", nc, nc, legacy=True)

    dt = collections.OrderedDict()
    h = torch.tensor([1.0, -2.5, 6e-8, 65504.0, float("inf"), float("-inf"), float("nan"), 0.0,
                      -0.0, 1e-5], dtype=torch.float16)
    dt["half"] = h
    dt["bf16"] = (torch.randn(4, 5) * 100).to(torch.bfloat16)
    dt["double"] = torch.randn(3, 3, dtype=torch.float64) * 1e3 + 1e-9
    dt["half_t"] = torch.randn(4, 6).half().t()
    dt["long"] = torch.tensor([-(2 ** 62), 3, 0], dtype=torch.int64)
    save(out, "dtypes.pth", dt, dt)

    pr = collections.OrderedDict()
    pr["w"] = torch.nn.Parameter(torch.randn(3, 2))
    pr["b"] = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    save(out, "param.pth", pr, pr)

    import resnet_golden
    torch.manual_seed(1)
    m = resnet_golden.model("smallcnn", 1, 10)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 1, 28, 28)).sum().backward()
    opt.step()
    sd = m.state_dict()
    save(out, "ckpt_model.pth", {"epoch": 3, "model": sd, "optimizer": opt.state_dict(),
                                 "args": {"lr": 0.1, "name": "x", "flags": [True, None]}}, sd)
    save(out, "ckpt_state_dict.pth", {"state_dict": sd, "best_acc1": 0.5}, sd)
    save(out, "ckpt_model_state_dict.pth", {"model_state_dict": sd, "epoch": 2}, sd)
    save(out, "ckpt_net.pth", {"net": sd, "epoch": 1}, sd)
    ddp = collections.OrderedDict(("module." + k, v) for k, v in sd.items())
    save(out, "ddp.pth", ddp, ddp)

    # the same archive with another record prefix (as torch < 2 names it by
    # the file's stem)
    src = os.path.join(out, "param.pth")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(
            os.path.join(out, "renamed_prefix.pth"), "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            name = "my_weights" + info.filename[info.filename.index("/"):]
            zout.writestr(name, zin.read(info.filename), zipfile.ZIP_STORED)
    safetensors_golden.write_by_hand(os.path.join(out, "renamed_prefix.expect.safetensors"),
                                     collections.OrderedDict((k, expect(v)) for k, v in
                                                             pr.items()), {})

    torch.save(m, os.path.join(out, "whole_module.pth"))
    marker = os.path.join(out, "PWNED")
    if os.path.exists(marker):
        os.remove(marker)
    save(out, "evil_system.pth", {"w": torch.zeros(2), "x": Evil(os.system, "touch " + marker)})
    save(out, "evil_system_legacy.pth", {"x": Evil(os.system, "touch " + marker)}, legacy=True)
    save(out, "evil_eval.pth", {"x": Evil(eval, f"open({marker!r}, 'w')")})
    assert not os.path.exists(marker)
    bad_files(out)


def tensor_pickle(size, stride, offset=0, numel=4, storage=b"FloatStorage"):
    """Protocol-2 bytes of OrderedDict(w=_rebuild_tensor_v2(storage '0', ...)), by hand."""
    def i(v):
        return b"J" + v.to_bytes(4, "little", signed=True) if v < 2 ** 31 else \
            b"\x8a\x08" + v.to_bytes(8, "little", signed=True)

    def tup(vs):
        return b"(" + b"".join(i(v) for v in vs) + b"t"

    def s(t):
        return b"X" + len(t).to_bytes(4, "little") + t

    od = b"ccollections\nOrderedDict\n)R"
    return (b"\x80\x02" + od + b"(" + s(b"w") + b"ctorch._utils\n_rebuild_tensor_v2\n(" +
            b"(" + s(b"storage") + b"ctorch\n" + storage + b"\n" + s(b"0") + s(b"cpu") +
            i(numel) + b"tQ" + i(offset) + tup(size) + tup(stride) + b"\x89" + od + b"tRu.")


def handmade_zip(path, pkl, data=b"\0" * 16, prefix="archive"):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(prefix + "/data.pkl", pkl)
        z.writestr(prefix + "/data/0", data)
        z.writestr(prefix + "/version", b"3\n")


def bad_files(out):
    """Files the reader must refuse (each a different check), named bad_*.pth."""
    j = os.path.join
    handmade_zip(j(out, "ok_handmade.pth"), tensor_pickle([2, 2], [2, 1]))
    handmade_zip(j(out, "bad_offset.pth"), tensor_pickle([3], [1], offset=2))
    handmade_zip(j(out, "bad_stride.pth"), tensor_pickle([2, 2], [3, 1]))
    handmade_zip(j(out, "bad_numel.pth"), tensor_pickle([2], [1], numel=1000))
    handmade_zip(j(out, "bad_overflow.pth"), tensor_pickle([3], [2 ** 62]))
    handmade_zip(j(out, "bad_negative.pth"), tensor_pickle([2], [-1]))
    handmade_zip(j(out, "bad_expand.pth"), tensor_pickle([2 ** 40], [0]))
    handmade_zip(j(out, "bad_dtype.pth"), tensor_pickle([2], [1], storage=b"IntStorage"))
    # SETITEM on a list, APPEND on a dict, an unknown opcode, a memo get never put
    handmade_zip(j(out, "bad_setitem_list.pth"), b"\x80\x02]K\x01K\x02s.")
    handmade_zip(j(out, "bad_append_dict.pth"), b"\x80\x02}K\x01a.")
    handmade_zip(j(out, "bad_opcode.pth"), b"\x80\x02(i__builtin__\nobject\n.")
    handmade_zip(j(out, "bad_memo.pth"), b"\x80\x02h\x05.")
    handmade_zip(j(out, "bad_no_stop.pth"), b"\x80\x02}")
    # a record whose name the pickle uses is missing; a compressed record
    handmade_zip(j(out, "bad_missing_record.pth"), tensor_pickle([2], [1]).replace(
        b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x007"))
    with zipfile.ZipFile(j(out, "bad_compressed.pth"), "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", tensor_pickle([2], [1]))
        z.writestr("archive/data/0", b"\0" * 16)


def check_written(path, arch, classes, in_ch, expect_path):
    sd = torch.load(path, weights_only=True)
    if arch == "smallcnn":
        import resnet_golden
        m = resnet_golden.model(arch, in_ch, classes)
    else:
        m = getattr(torchvision.models, arch)(num_classes=classes)
        if in_ch != 3:
            m.conv1 = torch.nn.Conv2d(in_ch, 64, 7, 2, 3, bias=False)
    m.load_state_dict(sd, strict=True)
    ref, _, _ = safetensors_golden.read_by_hand(expect_path)
    assert list(sd.keys()) == list(m.state_dict().keys()), "names or order differ"
    assert list(sd.keys()) == list(ref.keys())
    for k, v in sd.items():
        assert type(v) is torch.Tensor, (k, type(v))
        assert v.dtype == ref[k].dtype, (k, v.dtype, ref[k].dtype)
        assert torch.equal(v, ref[k]), k
        if k.endswith("num_batches_tracked"):
            assert v.dtype == torch.int64 and v.dim() == 0, k
    # _metadata exactly as torch writes it: every module in state_dict()'s
    # visiting order (parameterless ReLU/MaxPool included), with its _version
    md = sd._metadata
    want = m.state_dict()._metadata
    if arch == "smallcnn":  # the twin has a parameterless 'flatten' cohort's model does without
        want = {k: v for k, v in want.items() if k in md or k != "flatten"}
    assert list(md.keys()) == list(want.keys()), ("_metadata modules", list(md.keys()), list(want.keys()))
    for name in want:
        assert md[name] == {"version": want[name]["version"]}, (name, md[name], want[name])
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED, info.filename
            if "/data/" in info.filename:
                with open(path, "rb") as f:
                    f.seek(info.header_offset + 28)
                    extra_len = int.from_bytes(f.read(2), "little")
                data_at = info.header_offset + 30 + len(info.filename.encode()) + extra_len
                assert data_at % 64 == 0, (info.filename, data_at)
    print(f"{path}: torch.load(weights_only=True) and load_state_dict(strict=True) ok, "
          f"{len(sd)} tensors equal")


def resnet50(out):
    m = resnet("resnet50", 1000)
    sd = m.state_dict()
    torch.save(sd, os.path.join(out, "resnet50_zip.pth"))
    safetensors_golden.write_by_hand(os.path.join(out, "resnet50.safetensors"), sd,
                                     {"format": "pt"})


def main():
    if len(sys.argv) == 7 and sys.argv[1] == "--check-written":
        check_written(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif len(sys.argv) == 3 and sys.argv[1] == "--resnet50":
        resnet50(sys.argv[2])
    elif len(sys.argv) == 2:
        fixtures(sys.argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
