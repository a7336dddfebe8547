"""NT-ASGD (Merity et al. 2017, AWD-LSTM) with torchext: a small
character-level LSTM language model trained on the Python standard library's
own source files (on every machine, no download).

Training runs as plain SGD (torchext ASGD with lambd=0 and averaging off)
until ``NonMonotonicTrigger`` sees the validation loss stop improving; it then
calls ``optimizer.start_averaging()`` and training continues. Every epoch
prints the validation loss and perplexity of the raw weights and of the
averaged weights (``optimizer.averaged_parameters()``, an in-place swap) side
by side. With matplotlib installed (optional), ``--plot PNG`` draws both
curves.

    python examples/ntasgd_language_model.py [--epochs 16] [--plot curves.png]
"""
import argparse
import glob
import math
import os
import sysconfig
import time

import torch

import torchext


def stdlib_text(n_train, n_val):
    """Train and validation text from the stdlib's top-level modules (sorted,
    so every run of one Python version reads the same files); validation
    comes from other files than training."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    chunks, total = [], 0
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            chunks.append(f.read())
        total += len(chunks[-1])
        if total >= n_train + n_val:
            break
    text = "".join(chunks)
    return text[:n_train], text[-n_val:]


class Vocab:
    def __init__(self, text):
        self.chars = sorted(set(text)) + ["\0"]  # \0: characters unseen in training
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text):
        unk = len(self.chars) - 1
        return torch.tensor([self.index.get(c, unk) for c in text], dtype=torch.long)


class CharLSTM(torch.nn.Module):
    """AWD-LSTM in small: embedding and output dropout, tied weights."""

    def __init__(self, vocab, dim=256, layers=2, dropout=0.1):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.lstm = torch.nn.LSTM(dim, dim, layers, dropout=dropout, batch_first=True)
        self.drop = torch.nn.Dropout(dropout)
        self.out = torch.nn.Linear(dim, vocab)
        self.out.weight = self.embed.weight  # weight tying

    def forward(self, x, state=None):
        h, state = self.lstm(self.drop(self.embed(x)), state)
        return self.out(self.drop(h)), state


def batchify(ids, batch):
    n = ids.numel() // batch
    return ids[:n * batch].view(batch, n)  # row b is one contiguous stream


def run_epoch(model, data, bptt, opt=None, clip=0.25):
    """One pass over `data` (truncated BPTT, state carried between windows).
    Trains when `opt` is given; returns the mean loss per character."""
    model.train(opt is not None)
    state, total, count = None, 0.0, 0
    with torch.set_grad_enabled(opt is not None):
        for i in range(0, data.shape[1] - 1, bptt):
            x = data[:, i:i + bptt]
            y = data[:, i + 1:i + 1 + bptt]
            x = x[:, :y.shape[1]]
            logits, state = model(x, state)
            state = tuple(s.detach() for s in state)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     y.reshape(-1))
            if opt is not None:
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
            total += loss.item() * y.numel()
            count += y.numel()
    return total / count


def save_plot(path, history, trigger_epoch):
    try:
        import matplotlib
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); "
              "no plot written")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h[0] for h in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [h[1] for h in history], "o-", label="raw weights")
    ax.plot(epochs, [h[2] for h in history], "s-", label="averaged weights (ax)")
    if trigger_epoch is not None:
        ax.axvline(trigger_epoch, color="gray", ls="--", label="NonMonotonicTrigger fired")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation perplexity (per character)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=16)
    ap.add_argument("--train-chars", type=int, default=100_000)
    ap.add_argument("--val-chars", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bptt", type=int, default=50)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=8.0)
    ap.add_argument("--nonmono", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (default 1: matrices this small gain little from more)")
    ap.add_argument("--plot", metavar="PNG", help="write the curves (needs matplotlib)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    train_text, val_text = stdlib_text(args.train_chars, args.val_chars)
    vocab = Vocab(train_text)
    train = batchify(vocab.encode(train_text), args.batch)
    val = batchify(vocab.encode(val_text), 8)
    model = CharLSTM(len(vocab.chars), dim=args.dim)
    # lambd=0: eta == lr, so this is plain SGD; t0 huge: no averaging until
    # the trigger calls start_averaging().
    opt = torchext.optim.ASGD(model.parameters(), lr=args.lr, lambd=0.0, t0=1e12,
                              weight_decay=1.2e-6)
    trigger = torchext.optim.NonMonotonicTrigger(opt, nonmono=args.nonmono)
    print(f"{len(train_text)} training / {len(val_text)} validation characters of the "
          f"stdlib's source, vocabulary {len(vocab.chars)}")
    print(f"{'epoch':>5} {'raw loss':>9} {'raw ppl':>8} {'avg loss':>9} {'avg ppl':>8}  note")
    history, trigger_epoch, start = [], None, time.time()
    for epoch in range(1, args.epochs + 1):
        run_epoch(model, train, args.bptt, opt)
        raw = run_epoch(model, val, args.bptt)
        note = ""
        if trigger_epoch is not None:
            with opt.averaged_parameters():
                avg = run_epoch(model, val, args.bptt)
        else:
            avg = raw  # not averaging yet: ax is the current iterate
        # AWD-LSTM feeds the trigger the metric of the weights it would keep.
        if trigger.step(avg):
            trigger_epoch = epoch
            note = "trigger fired: averaging starts with the next step"
        history.append((epoch, math.exp(raw), math.exp(avg)))
        print(f"{epoch:5d} {raw:9.4f} {math.exp(raw):8.3f} {avg:9.4f} {math.exp(avg):8.3f}  "
              f"{note}", flush=True)
    print(f"{time.time() - start:.0f} s")
    if trigger_epoch is None:
        print("the trigger did not fire: no averaged weights to compare (try more --epochs)")
    else:
        _, raw_ppl, avg_ppl = history[-1]
        print(f"final validation perplexity: raw {raw_ppl:.3f}, averaged {avg_ppl:.3f} "
              f"({100 * (raw_ppl - avg_ppl) / raw_ppl:+.1f}% for the average)")
    if args.plot:
        save_plot(args.plot, history, trigger_epoch)
    return history, trigger_epoch


if __name__ == "__main__":
    main()
