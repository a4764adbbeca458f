"""Where a DuplexCadence Mimi step spends its time on the GPU (diagnostic, not a benchmark)."""
import time
import torch
from duplexcadence.examples.moshi.model import build_mimi, random_codes
from duplexcadence.examples.moshi.cadence import load_runtime

torch.backends.cudnn.deterministic = True
rt = load_runtime(build_mimi(device="cuda"), 1, device="cuda")
session = rt.session()
codes = random_codes(1, 400, seed=3).cuda()
with torch.no_grad():
    for t in range(150):
        session.step(codes=codes[:, :, t:t + 1])
    torch.cuda.synchronize()
    print("counters", session.counters, "runs", {k: [(r[0], len(r[2])) for r in v] for k, v in list(session.runs.items())[:2]})
    host = []
    for t in range(150, 250):
        s = time.perf_counter(); session.step(codes=codes[:, :, t:t + 1]); host.append(time.perf_counter() - s)
    torch.cuda.synchronize()
    print("step host-side us (no sync) median", sorted(host)[50] * 1e6)
    synced = []
    for t in range(250, 350):
        torch.cuda.synchronize(); s = time.perf_counter(); session.step(codes=codes[:, :, t:t + 1]); torch.cuda.synchronize()
        synced.append(time.perf_counter() - s)
    print("step synced us median", sorted(synced)[50] * 1e6)
    graph = next(iter(session.graphs.values())).graph
    # The codes' scratch bytes are reused by later stages' scratch regions within the instant (the arena
    # shares scratch by liveness), so every bare replay is fed valid codes first, as a step feeds them.
    feed = session.storage["codes"].view(1)
    replays = []
    for _ in range(100):
        torch.cuda.synchronize(); s = time.perf_counter(); feed.copy_(codes[:, :, :1]); graph.replay()
        torch.cuda.synchronize()
        replays.append(time.perf_counter() - s)
    print("bare fused-graph replay (after the codes copy) synced us median", sorted(replays)[50] * 1e6)
    launch = []
    for _ in range(100):
        torch.cuda.synchronize(); s = time.perf_counter(); feed.copy_(codes[:, :, :1]); graph.replay()
        launch.append(time.perf_counter() - s)
    torch.cuda.synchronize()
    print("bare replay host-side launch us median", sorted(launch)[50] * 1e6)
