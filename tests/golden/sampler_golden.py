"""Reference index lists from PyTorch's own DistributedSampler + BatchSampler.

Usage: sampler_golden.py OUT.txt
Each output line: "n W rank seed epoch drop_last shuffle batch_size batch_drop_last :
<indices of the rank> | <lengths of the batches>". tests/test_sampler.c
recomputes every line with ch_sampler and compares index for index.
Also writes "randperm n seed : <perm>" lines for torch.randperm itself.
"""
import sys

import torch
from torch.utils.data import BatchSampler, DistributedSampler

torch.set_num_threads(1)


def cases():
    # (n, world sizes, seeds, epochs)
    for n in (0, 1, 2, 3, 5, 7, 10, 17, 100, 1001):
        for W in (1, 2, 3, 4, 8):
            for seed in (0, 42):
                for epoch in (0, 1, 5):
                    for drop_last in (False, True):
                        for shuffle in (True, False) if (seed == 0 and epoch == 0) else (True,):
                            yield n, W, seed, epoch, drop_last, shuffle
    # the real dataset sizes (Fashion-MNIST / CIFAR-10 train and test)
    for n in (60000, 10000, 50000):
        for W in (1, 4):
            for epoch in (0, 3):
                yield n, W, 0, epoch, False, True
    yield 60000, 3, 7, 2, True, True


def main():
    out = open(sys.argv[1], "w")
    for n, W, seed, epoch, drop_last, shuffle in cases():
        ds = range(n)
        for rank in range(W):
            s = DistributedSampler(ds, num_replicas=W, rank=rank, shuffle=shuffle,
                                   seed=seed, drop_last=drop_last)
            s.set_epoch(epoch)
            idx = list(iter(s))
            assert len(idx) == len(s)
            for bs, bdl in ((1, False), (3, True), (64, False)):
                if bs == 1 and n > 1001:
                    continue
                batches = list(BatchSampler(s, batch_size=bs, drop_last=bdl))
                flat = [i for b in batches for i in b]
                assert flat == idx[:len(flat)]
                out.write(f"{n} {W} {rank} {seed} {epoch} {int(drop_last)} {int(shuffle)} "
                          f"{bs} {int(bdl)} : {' '.join(map(str, idx))} | "
                          f"{' '.join(str(len(b)) for b in batches)}\n")
    for n, seed in ((1, 0), (2, 1), (10, 0), (1000, 123), (70000, 2**32 + 3), (100, 2**40)):
        g = torch.Generator()
        g.manual_seed(seed)
        p = torch.randperm(n, generator=g).tolist()
        out.write(f"randperm {n} {seed} : {' '.join(map(str, p))}\n")
    out.close()


if __name__ == "__main__":
    main()
