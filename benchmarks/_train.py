"""A small torch CPU training loop (the main thread's work in the overhead and cadence runs)."""

TRAIN_SETUP = """
import torch, time
torch.manual_seed(0)
_model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
_opt = torch.optim.SGD(_model.parameters(), lr=0.01)
_x = torch.randn(128, 256); _y = torch.randint(0, 10, (128,))
def train_steps(n):
    for _ in range(n):
        loss = torch.nn.functional.cross_entropy(_model(_x), _y)
        _opt.zero_grad(); loss.backward(); _opt.step()
    return loss.item()
def steps_for(seconds):
    train_steps(5)
    t = time.perf_counter(); train_steps(20); dt = (time.perf_counter() - t) / 20
    return max(10, int(seconds / dt))
"""


def namespace() -> dict:
    ns: dict = {}
    exec(TRAIN_SETUP, ns)
    return ns
