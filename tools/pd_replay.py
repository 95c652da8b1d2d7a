"""How much the placement of long prompts on the prefill pods can move the interference
scenario's p90 TTFT: replays a `kvbench compare-pd --scenario interference --records` run.

The overall p90 TTFT of that scenario sits near the long prompts' median (they are ~20% of the
requests; the short ones, prefilled on the decode pods, answer in ~150 ms). This replays the long
prompts' arrivals of the `selective >512` row through a first-come-first-served model of two
prefill pods in kvsim's seed cost model (a step is 40 ms plus 0.4 ms per prefill token, in
chunks of 2,048 tokens, so a prompt of n tokens occupies its pod for 40 + n × 0.42 ms) and prints
the long prompts' median and p90 time to the end of their prefill when they are placed
round-robin, as the baseline does, and on the pod whose queue ends first (least work). For each
kvroute P/D row it then adds the short prompts kvroute split onto the prefill pods (read from its
debug lines), least-work, and prints the long prompts' median with and without them.

python3 tools/pd_replay.py bench-out/pd-interference.json [more runs...]
"""
import json
import re
import statistics
import sys

STEP_MS, MS_PER_TOKEN, CHUNK = 40.0, 0.4, 2048
PER_TOKEN_MS = (STEP_MS + MS_PER_TOKEN * CHUNK) / CHUNK


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def replay(jobs, pick):
    """Each job (arrival ms, tokens, is_long) on the pod `pick` chooses; the long ones' times."""
    free, times = [0.0, 0.0], []
    for i, (t, tokens, long_prompt) in enumerate(jobs):
        pod = pick(i, free)
        end = max(t, free[pod]) + STEP_MS + tokens * PER_TOKEN_MS
        free[pod] = end
        if long_prompt:
            times.append(end - t)
    return times


def least_work(_, free):
    return 0 if free[0] <= free[1] else 1


def round_robin(i, _):
    return i % 2


def sent(row):
    return sorted((r for r in row["report"]["records"] if r.get("sent")), key=lambda r: r["start_s"])


for path in sys.argv[1:]:
    rows = json.load(open(path))["rows"]
    selective = next(r for r in rows if "selective" in r["label"])
    longs = [(r["start_s"] * 1000, r["prompt_tokens"], True) for r in sent(selective) if r["prompt_words"] >= 1000]
    rr, lw = replay(longs, round_robin), replay(longs, least_work)
    print(f"{path}: {len(longs)} long prompts; round-robin p50 {statistics.median(rr):.0f} p90 {pct(rr, .9):.0f} ms, "
          f"least work p50 {statistics.median(lw):.0f} p90 {pct(lw, .9):.0f} ms "
          f"(p50 {statistics.median(lw) / statistics.median(rr):.3f}×)")
    for row in rows:
        if not row["label"].startswith("P/D"):
            continue
        jobs = []
        for r in sent(row):
            split = re.search(r"pd=disaggregated", r.get("debug") or "") is not None
            long_prompt = r["prompt_words"] >= 1000
            if long_prompt or split:
                jobs.append((r["start_s"] * 1000, r["prompt_tokens"], long_prompt))
        alone = replay([j for j in jobs if j[2]], least_work)
        shared = replay(jobs, least_work)
        shorts = sum(1 for j in jobs if not j[2])
        print(f"  {row['label']}: {shorts} short prompts split; long p50 least work {statistics.median(alone):.0f} ms alone, "
              f"{statistics.median(shared):.0f} with them ({statistics.median(shared) / statistics.median(alone):.3f}×)")
