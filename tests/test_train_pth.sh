#!/bin/sh
# cohort-train with PyTorch's own files, as the new user tried it:
# --output.format=pth writes model-0.pth that torch.load(weights_only=True)
# and load_state_dict(strict=True) take; --model.weights reads it back (and
# a torch.save'd checkpoint dict, with --model.weights_key); a .pth whose
# pickle calls os.system is refused before any step and its command never
# runs.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..6"
small="--model.arch=smallcnn --data.train_subset=256 --train.eval=false --schedule.epochs=1"
py="${PYTHON3:-/usr/bin/python3}"
have_torch=no
"$py" -c 'import torch' 2>/dev/null && have_torch=yes

train 1 "$tmp/a" $small --output.format=pth
check "output.format = pth writes model-0.pth and no .safetensors model file" \
  sh -c "test -s '$tmp/a/model-0.pth' && ! test -e '$tmp/a/model-0.safetensors' || { tail '$tmp/a.log'; false; }"
check "... and the log names the file it wrote (saved .../model-0.pth)" grep -q "^saved .*/model-0\.pth$" "$tmp/a.log"
if [ "$have_torch" = yes ]; then
  check "torch.load(weights_only=True) + load_state_dict(strict=True) take it" \
    env OMP_NUM_THREADS=1 "$py" -c "
import sys, torch
sys.path.insert(0, '${COHORT_SRCDIR:-.}/tests/golden')
import resnet_golden
sd = torch.load('$tmp/a/model-0.pth', weights_only=True)
resnet_golden.model('smallcnn', 1, 10).load_state_dict(sd, strict=True)
assert sd['bn1.num_batches_tracked'].item() == 4, sd['bn1.num_batches_tracked']
torch.save({'epoch': 1, 'net': sd}, '$tmp/ckpt.pth', _use_new_zipfile_serialization=False)
class Evil:
    def __reduce__(self):
        import os
        return (os.system, ('touch $tmp/PWNED',))
torch.save({'x': Evil()}, '$tmp/evil.pth')
"
else
  skip "torch.load takes it" "no torch for $py"
fi
train 1 "$tmp/b" $small --model.weights="$tmp/a/model-0.pth"
check "model.weights reads it back: every tensor loaded" \
  grep -q "loaded 14 of 14 tensors from $tmp/a/model-0.pth" "$tmp/b.log"
if [ "$have_torch" = yes ]; then
  train 1 "$tmp/c" $small --model.weights="$tmp/ckpt.pth" --model.weights_key=net
  check "a legacy checkpoint dict with model.weights_key = net" \
    grep -q "state dict under 'net'" "$tmp/c.log"
  train 1 "$tmp/d" $small --model.weights="$tmp/evil.pth"
  rc=$?
  if [ "$rc" != 0 ] && grep -q "refused global posix.system" "$tmp/d.log" &&
     ! test -e "$tmp/PWNED" && ! grep -q "^epoch 0" "$tmp/d.log"; then
    ok "a pickle calling os.system is refused by name and nothing ran (exit $rc)"
  else
    show "$tmp/d.log"; not_ok "os.system pickle (exit $rc)"
  fi
else
  skip "checkpoint dict" "no torch"
  skip "os.system pickle" "no torch"
fi
