"""Programs used over time, for tests/test_call_sequences.py, test_call_sequences_bounds.py, test_fixed_sizes.py and
gpu_call_sequences.py: a cache grown by `cat` with a reset method, a streaming list of state tensors, sizes set by
an int input or by flat ids with offsets, a beam search."""
from typing import List

import torch


class KVCache(torch.nn.Module):
    """An incremental decoder's attention: keys and values appended to module buffers every call, a position
    counter, and a reset method."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (torch.nn.Linear(16, 16) for _ in range(4))
        self.k_cache = torch.zeros(1, 2, 0, 8)
        self.v_cache = torch.zeros(1, 2, 0, 8)
        self.pos = 0

    def forward(self, x):
        q = self.q(x).view(1, 1, 2, 8).transpose(1, 2)
        self.k_cache = torch.cat([self.k_cache, self.k(x).view(1, 1, 2, 8).transpose(1, 2)], 2)
        self.v_cache = torch.cat([self.v_cache, self.v(x).view(1, 1, 2, 8).transpose(1, 2)], 2)
        self.pos += 1
        attention = torch.softmax(q @ self.k_cache.transpose(-1, -2) / 8 ** 0.5, -1)
        y = (attention @ self.v_cache).transpose(1, 2).reshape(1, 1, 16)
        return self.out(y).relu() + float(self.pos)

    @torch.jit.export
    def reset(self) -> None:
        self.k_cache = self.k_cache[:, :, :0]  # (empty, on the cache's device)
        self.v_cache = self.v_cache[:, :, :0]
        self.pos = 0


class Streaming(torch.nn.Module):
    """A streaming encoder's state: a list of tensors whose memory grows by a row per chunk up to a maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.memory: List[torch.Tensor] = [torch.zeros(0, 8)]
        self.chunks = 0

    def forward(self, x):
        h = self.lin(x).tanh()
        memory = torch.cat([self.memory[0], h.mean(0, keepdim=True)], 0)
        if memory.size(0) > 3:
            memory = memory[-3:]
        self.memory = [memory]
        self.chunks += 1
        return h + memory.sum(0), memory * 2


class LoopN(torch.nn.Module):
    """A size set by a value: the stack's length is the input `n`."""

    def forward(self, x, n: int):
        steps = []
        for _ in range(n):
            x = x.sin() * 1.1 + 0.1
            steps.append(x)
        return torch.stack(steps).relu() * 2 + 1


class Bag(torch.nn.Module):
    """Flat ids with offsets (KeyedJaggedTensor style): the ids' count varies per call."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="sum")

    def forward(self, ids, offsets):
        return self.bag(ids, offsets).relu() * 2


class BeamSearch(torch.nn.Module):
    """A scripted beam search: a GRU cell over an expanded initial state, top-k over beam x vocab, finished
    hypotheses and their length-normalised scores appended to lists, a break when enough are finished or every beam
    is dead, the step count returned (new tensors on the input's device: it runs on CUDA too). How many steps it
    takes, and so every size after the loop, depends on the values."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(8, 16)
        self.embed = torch.nn.Embedding(20, 8)
        self.project = torch.nn.Linear(16, 20)

    def forward(self, h0, bos: int):
        beam = 4
        h = h0.expand(beam, 16)
        tokens = torch.full([beam], bos, dtype=torch.long, device=h0.device)
        scores = torch.zeros(beam, device=h0.device)
        finished: List[torch.Tensor] = []
        finished_scores: List[float] = []
        step = 0
        while True:
            h = self.cell(self.embed(tokens), h)
            log_probs = torch.log_softmax(self.project(h) * 4, -1)
            total = log_probs[0] if step == 0 else (scores.unsqueeze(1) + log_probs).view(-1)
            top, index = total.topk(beam)
            tokens = index % 20
            h = h[torch.div(index, 20, rounding_mode="floor")]
            scores = top
            step += 1
            ended = tokens == 3
            if bool(ended.any()):
                for i in range(beam):
                    if bool(ended[i]):
                        finished.append(h[i])
                        finished_scores.append(float(scores[i]) / step)
                scores = scores.masked_fill(ended, -1e9)
            if len(finished) >= beam or bool((scores <= -1e9).all()) or step > 60:
                break
        if len(finished) == 0:
            return torch.zeros(1, device=h0.device), torch.zeros(1, 16, device=h0.device), step
        return torch.tensor(finished_scores, device=h0.device), torch.stack(finished), step


class RowsByValue(torch.nn.Module):
    """A size an int input sets, at values the model refuses near the example's: a reshape of 10 elements into
    `n` rows runs at n=5 but not at 4, 6 or 7, which conversion tries."""

    def forward(self, x, n: int):
        return (x.reshape(n, -1) * 2.0).relu().sum(1)


class EncodeThenDecode(torch.nn.Module):
    """A forward that needs another method called first: TorchScript raises until `encode` has run."""

    def __init__(self) -> None:
        super().__init__()
        self.project = torch.nn.Linear(4, 4)
        self.memory = torch.zeros(0, 4)
        self.ready = False

    @torch.jit.export
    def encode(self, x):
        self.memory = self.project(x).relu()
        self.ready = True
        return x.sum()

    def forward(self, y):
        if not self.ready:
            raise RuntimeError("call encode first")
        return self.memory * y + 1.0
