#!/usr/bin/python3
"""torch-gpu.py - PyTorch eager fp32 on CUDA, for scripts/bench-gpu.sh: the
model of ../shared/anchors/ref_gpt.py (imported, not copied) trained with
AdamW (betas 0.9/0.99, decay on matrices) and norm clipping on the same data,
timing --iters steps after 2 warm-up steps. TF32 is off, as in swarm.

  python3 scripts/torch-gpu.py --ref ../shared/anchors/ref_gpt.py --data FILE \
      --layers 4 --heads 4 --embd 128 --block 64 --batch 12 --iters 300

Prints one line ending in "| tok/s N".
"""
import argparse
import importlib.util
import sys
import time


def main():
    p = argparse.ArgumentParser()
    for flag in ("--layers", "--heads", "--embd", "--block", "--batch", "--iters"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--data", required=True)
    a = p.parse_args()
    # ref_gpt.py reads its flags when imported
    sys.argv = [a.ref, "--layers", str(a.layers), "--heads", str(a.heads), "--embd", str(a.embd),
                "--block", str(a.block), "--batch", str(a.batch), "--data", a.data]
    spec = importlib.util.spec_from_file_location("ref_gpt", a.ref)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    torch, np = ref.torch, ref.np
    if not torch.cuda.is_available():
        print("torch-gpu.py: torch %s has no CUDA device" % torch.__version__)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    dev = torch.device("cuda")
    model = ref.ByteGPT(a.block, a.embd, a.layers, a.heads).to(dev)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    with open(a.data, "rb") as f:
        raw = f.read()
    split = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8)[:int(0.9 * len(raw))].copy())
    rng = ref.SplitMix64(1337)

    def step():
        x, y, _ = ref.get_batch(split, rng, a.batch, a.block)
        _, loss = model(x.to(dev), y.to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(a.iters):
        loss = step()
    torch.cuda.synchronize()
    dt = time.time() - t0
    print("torch %s | %s | fp32 eager | loss %.4f | iters %d | tok/s %.0f"
          % (torch.__version__, torch.cuda.get_device_name(), loss.item(), a.iters,
             a.batch * a.block * a.iters / dt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
