"""The two-model repository the serving tests serve (test_serving_repository over HTTP, test_serving_grpc over gRPC):
emb (a dynamic batch, so batched) and two (static, two inputs), written as packages into one folder."""
import torch

import jit2triton

VOCAB, WIDTH = 10, 8


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)

    def forward(self, ids):
        return torch.tanh(self.embedding(ids)).sum(1)  # float32[batch, 8]: a fixed dim after a dynamic one


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        return torch.relu(self.linear(x)) + y


def write_repository(folder) -> tuple[str, dict]:
    """emb.j2t and two.j2t in `folder`; -> (the folder, their TorchScript models by name)."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 3))
    emb = torch.jit.trace(Embed().eval(), (ids,))
    jit2triton.convert(emb, example_inputs=(ids,),
                       dynamic_shapes={"ids": {0: jit2triton.Dim("batch", min=1, max=16)}}).save(folder / "emb.j2t")
    example = (torch.randn(2, 4), torch.randn(2, 3))
    two = torch.jit.trace(TwoInputs().eval(), example)
    jit2triton.convert(two, example_inputs=example).save(folder / "two.j2t")
    return str(folder), {"emb": emb, "two": two}
