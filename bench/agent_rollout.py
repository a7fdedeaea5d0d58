"""Agentic rollouts (issue 15): the asynchronous agent loop against today's synchronous generate.

    RAY_AUTH_MODE=disabled .venv/bin/python bench/agent_rollout.py [--samples 32] [--tokens 512]
        [--budget 1024] [--turns 4] [--latency 0.05,0.5] [--repeats 3] [--workloads single,multi,instant]
    RAY_AUTH_MODE=disabled .venv/bin/python bench/agent_rollout.py --quick   # smoke run; numbers mean nothing

One process, one vLLM engine (`VLLMRollout`), the tiny Qwen2 of `tandem.models.tiny.save_tiny` (random weights,
fp32, CPU). Prompts: "a*b=" with a, b uniform in [0, 999], rendered by the tiny chat template; one sample
per prompt. Stop ids: <|endoftext|> and <|im_end|> (the template's end of turn); at temperature 1.0 the
random model hits one after anything from 2 tokens to never, so response lengths have a long tail.

Workload "single": one turn of at most --tokens tokens.
  sync   `VLLMRollout.generate(prompts, sampling)`: the whole batch in one vLLM call.
  async  `AgentLoop` with no tools and no interaction over `VLLMRollout.turn_engine`.
Workload "multi": up to --turns assistant turns in a budget of --budget tokens per trajectory (generated
+ inserted). After every turn but the last an environment waits a delay drawn from --latency (seconds,
uniform, seeded per sample and turn; `asyncio.sleep`, standing in for a tool or a simulated user) and
answers "Try again", inserted through the chat template.
  sync   turn-synchronous, what today's synchronous generate allows: turn k of every active sample in
         one `llm.generate` call (the SamplingParams `VLLMRollout` uses, each request's max_tokens = its
         remaining budget), then every active sample's environment step at once (asyncio.gather: the
         barrier costs the slowest), insert, repeat.
  async  `AgentLoop` with the same environment as its interaction: one coroutine per sample, a sample's
         next turn joins the running batch as soon as its environment answers.
Workload "instant" (not run unless named): "multi" with an environment that answers at once, to tell
the cost of the turn barrier itself from that of waiting for the slowest environment step.
Both paths seed every turn as the agent loop does, so they sample the same tokens and do the same work
(the script checks it: "same trajectories").

Each mode runs once to warm up, then --repeats times, interleaved (sync, async, sync, ...); the table
shows min / median / max. tok/s = generated (model) tokens / wall seconds of the whole rollout, inserted
tokens and environment waits included in the seconds; samples/s = trajectories / wall seconds. steps: vLLM
engine steps (the sync path's counted around `llm_engine.step`, the async path's from the turn engine);
in flight: the most requests the engine held at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.batch import Batch
from tandem.data.prompts import collate_prompts
from tandem.models.tiny import IM_END, build_tokenizer, save_tiny
from tandem.rollout import SamplingParams
from tandem.rollout.agent import (
    AgentLoop,
    AgentSettings,
    ChatInserter,
    Trajectory,
    _turn_seed,  # private: the baseline seeds every turn as the agent loop does
)
from tandem.rollout.base import METRICS_KEY, request_seed
from tandem.rollout.vllm import VLLMRollout

TEMPERATURE = 1.0
SEED = 1
REPLY = "Try again"
WORKLOADS = ("single", "multi", "instant")
DEFAULT_WORKLOADS = "single,multi"


@dataclass(frozen=True)
class Reply:
    text: str | None
    done: bool


class SlowEnvironment:
    """Answers every answer with "Try again" after a delay in [low, high] s, fixed by (seed, sample, turn)."""

    def __init__(self, low: float, high: float, seed: int) -> None:
        self.low, self.high, self.seed = low, high, seed

    def delay(self, sample_index: int, turn: int) -> float:
        return random.Random(f"{self.seed}/{sample_index}/{turn}").uniform(self.low, self.high)

    async def respond(self, messages: list[dict[str, Any]], sample: dict[str, Any]) -> Reply:
        turn = sum(m["role"] == "assistant" for m in messages)
        await asyncio.sleep(self.delay(int(sample["extra_info"]["index"]), turn))
        return Reply(REPLY, False)


@dataclass
class Run:
    """One timed rollout: its wall seconds and what it generated."""

    seconds: float
    generated: int  # model tokens
    samples: int
    steps: int
    in_flight: int
    trajectories: list[list[int]]  # each sample's tokens after the prompt (generated and inserted)
    generated_per_sample: list[int]
    turn_lengths: list[int]  # tokens of every model turn
    turns: list[int]
    finish: list[str]
    inserted: int
    environment_s: float = 0.0  # the sync path's waits at the barrier (wall); 0 for async

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds


# ---- the model, the prompts ----------------------------------------------------------------------------


def make_prompts(tokenizer: Any, count: int, seed: int) -> Batch:
    """``count`` chat prompts "a*b=" (a, b uniform in [0, 999]); extra_info["index"] is the sample's."""
    rng = random.Random(seed)
    items = []
    for i in range(count):
        text = f"{rng.randrange(1000)}*{rng.randrange(1000)}="
        messages = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        items.append(
            {
                "input_ids": tokenizer(rendered, add_special_tokens=False)["input_ids"],
                "raw_prompt": messages,
                "data_source": "bench",
                "ground_truth": "",
                "extra_info": {"index": i},
                "index": i,
            }
        )
    return collate_prompts(items, tokenizer.pad_token_id)


def prompt_token_lists(prompts: Batch) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(prompts["input_ids"], prompts["attention_mask"])]


@contextmanager
def counted_steps(engine: VLLMRollout) -> Iterator[list[int]]:
    """Counts the vLLM engine steps taken inside the block (one instance attribute, removed after)."""
    llm_engine, counter = engine.llm.llm_engine, [0]
    step = llm_engine.step

    def counting_step() -> Any:
        counter[0] += 1
        return step()

    llm_engine.step = counting_step
    try:
        yield counter
    finally:
        del llm_engine.step


# ---- the two paths -----------------------------------------------------------------------------------


def from_batch(out: Batch, seconds: float, steps: int, in_flight: int, turn_lengths: list[int]) -> Run:
    """A Run from a generate call's batch (single-turn sync, or the agent loop)."""
    width = out["responses"].shape[1]
    lengths = out["attention_mask"][:, -width:].sum(1).tolist()
    generated = out["response_mask"].sum(1).tolist()
    multi = "agent_turns" in out
    return Run(
        seconds=seconds,
        generated=int(sum(generated)),
        samples=len(out),
        steps=steps,
        in_flight=in_flight,
        trajectories=[out["responses"][i, :n].tolist() for i, n in enumerate(lengths)],
        generated_per_sample=[int(g) for g in generated],
        turn_lengths=turn_lengths,
        turns=[int(t) for t in out["agent_turns"].tolist()] if multi else [1] * len(out),
        finish=list(out["agent_finish"]) if multi else [],
        inserted=int(sum(lengths) - sum(generated)),
    )


def single_sync(engine: VLLMRollout, prompts: Batch, sampling: SamplingParams) -> Run:
    with counted_steps(engine) as steps:
        start = time.perf_counter()
        out = engine.generate(prompts, sampling)
        seconds = time.perf_counter() - start
    lengths = [int(n) for n in out["response_mask"].sum(1).tolist()]
    return from_batch(out, seconds, steps[0], len(out), lengths)


def agent_async(loop: AgentLoop, engine: VLLMRollout, prompts: Batch, sampling: SamplingParams) -> Run:
    start = time.perf_counter()
    out = loop.generate(engine.turn_engine, prompts, sampling)
    seconds = time.perf_counter() - start
    metrics = out.meta[METRICS_KEY]
    run = from_batch(out, seconds, int(metrics["engine_steps"]), int(metrics["max_in_flight"]), [])
    mask = out["response_mask"]
    for row in range(len(out)):  # model turns are the runs of 1s in response_mask
        length = 0
        for bit in [*mask[row].tolist(), 0]:
            if bit:
                length += 1
            elif length:
                run.turn_lengths.append(length)
                length = 0
    return run


def turn_synchronous(
    engine: VLLMRollout,
    inserter: ChatInserter,
    tokenizer: Any,
    prompts: Batch,
    sampling: SamplingParams,
    settings: AgentSettings,
    environment: SlowEnvironment,
) -> Run:
    """The baseline of workload "multi" (see the module docstring), with the agent loop's stopping rules."""
    with counted_steps(engine) as steps:
        start = time.perf_counter()
        trajectories, environment_s, in_flight, turn_lengths = asyncio.run(
            _turn_synchronous(engine, inserter, tokenizer, prompts, sampling, settings, environment)
        )
        seconds = time.perf_counter() - start
    generated = [sum(t.model_mask) for t in trajectories]
    return Run(
        seconds=seconds,
        generated=sum(generated),
        samples=len(trajectories),
        steps=steps[0],
        in_flight=in_flight,
        trajectories=[t.token_ids for t in trajectories],
        generated_per_sample=generated,
        turn_lengths=turn_lengths,
        turns=[t.turns for t in trajectories],
        finish=[t.finish for t in trajectories],
        inserted=sum(len(t.token_ids) for t in trajectories) - sum(generated),
        environment_s=environment_s,
    )


async def _turn_synchronous(
    engine: VLLMRollout,
    inserter: ChatInserter,
    tokenizer: Any,
    prompts: Batch,
    sampling: SamplingParams,
    settings: AgentSettings,
    environment: SlowEnvironment,
) -> tuple[list[Trajectory], float, int, list[int]]:
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    prompt_ids = prompt_token_lists(prompts)
    samples = [{"extra_info": prompts["extra_info"][row]} for row in range(len(prompts))]
    seeds = [
        None if sampling.seed is None else request_seed(sampling.seed, row) for row in range(len(prompts))
    ]
    trajectories = [Trajectory(messages=list(prompts["raw_prompt"][row])) for row in range(len(prompts))]
    active = list(range(len(prompts)))
    environment_s, in_flight, turn_lengths = 0.0, 0, []
    while active:
        requests, params = [], []
        for i in active:
            traj = trajectories[i]
            requests.append(TokensPrompt(prompt_token_ids=[*prompt_ids[i], *traj.token_ids]))
            params.append(
                VLLMSamplingParams(  # VLLMRollout.generate's settings
                    n=1,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    max_tokens=sampling.max_tokens - len(traj.token_ids),
                    stop_token_ids=engine.eos_token_ids,
                    ignore_eos=False,
                    logprobs=0,
                    seed=seeds[i]
                    if traj.turns == 0 or seeds[i] is None
                    else _turn_seed(seeds[i], traj.turns),
                    detokenize=False,
                    skip_special_tokens=False,
                )
            )
        in_flight = max(in_flight, len(requests))
        outputs = engine.llm.generate(requests, params, use_tqdm=False)
        asking = []
        for i, output in zip(active, outputs, strict=True):
            traj, completion = trajectories[i], output.outputs[0]
            tokens = list(completion.token_ids)
            log_probs = [entry[t].logprob for entry, t in zip(completion.logprobs, tokens, strict=True)]
            traj.turns += 1
            traj.add(tokens, model=True, log_probs=log_probs)
            turn_lengths.append(len(tokens))
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            traj.messages.append({"role": "assistant", "content": text})
            traj.final_answer = text
            if completion.finish_reason == "length":
                traj.finish = "budget"
            elif traj.user_turns >= settings.max_user_turns:
                traj.finish = "answer"
            else:
                asking.append(i)
        # Every active sample's environment step at once: the next turn waits for the slowest.
        start = time.perf_counter()
        replies = await asyncio.gather(
            *(environment.respond(trajectories[i].messages, samples[i]) for i in asking)
        )
        environment_s += time.perf_counter() - start
        active = []
        for i, reply in zip(asking, replies, strict=True):
            traj = trajectories[i]
            if traj.turns >= settings.max_assistant_turns:
                traj.finish = "max_turns"
                continue
            inserted = [{"role": "user", "content": reply.text}]
            traj.messages.extend(inserted)
            ids = inserter.ids(inserted)
            if len(traj.token_ids) + len(ids) >= sampling.max_tokens:
                traj.finish = "budget"
                continue
            traj.add(ids, model=False)
            traj.user_turns += 1
            active.append(i)
    return trajectories, environment_s, in_flight, turn_lengths


# ---- measuring, printing -------------------------------------------------------------------------------


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def fmt(values: list[float], digits: int) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in spread(values))


def distribution(values: list[int]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"min {ordered[0]}  median {statistics.median(ordered):g}  p90 {p90}  max {ordered[-1]}"


def measure(
    name: str, engine: VLLMRollout, modes: dict[str, Callable[[], Run]], repeats: int
) -> dict[str, list[Run]]:
    """One warm-up of each mode, then ``repeats`` timed runs of each, interleaved. Every run starts
    with an empty prefix cache, as a rollout after a weight sync does (the runs repeat the same tokens)."""
    for label, fn in modes.items():
        say(f"{name}: warm-up {label}")
        fn()
    runs: dict[str, list[Run]] = {label: [] for label in modes}
    for r in range(repeats):
        for label, fn in modes.items():
            engine.llm.reset_prefix_cache()
            runs[label].append(fn())
            say(f"{name}: {label} run {r + 1}/{repeats}: {runs[label][-1].seconds:.2f} s")
    return runs


def print_table(runs: dict[str, list[Run]]) -> None:
    print(
        f"{'mode':<8}{'wall s (min/med/max)':>26}{'gen tok/s (min/med/max)':>28}{'samples/s (min/med/max)':>28}"
        f"{'gen tokens':>12}{'steps':>8}{'in flight':>11}"
    )
    for label, rs in runs.items():
        last = rs[-1]
        print(
            f"{label:<8}{fmt([r.seconds for r in rs], 2):>26}{fmt([r.tokens_per_s for r in rs], 0):>28}"
            f"{fmt([r.samples_per_s for r in rs], 2):>28}{last.generated:>12}{last.steps:>8}{last.in_flight:>11}"
        )


def same_work(runs: dict[str, list[Run]], seeded: bool) -> str:
    """How many samples' trajectories are token for token the same in the two paths' last runs."""
    sync, agent = runs["sync"][-1], runs["async"][-1]
    if not seeded:
        return "unseeded: the two paths drew different tokens"
    same = sum(a == b for a, b in zip(sync.trajectories, agent.trajectories, strict=True))
    return f"same trajectories in both paths: {same}/{len(sync.trajectories)}"


def ratio(runs: dict[str, list[Run]]) -> float:
    return statistics.median(r.tokens_per_s for r in runs["async"]) / statistics.median(
        r.tokens_per_s for r in runs["sync"]
    )


def summary(runs: dict[str, list[Run]]) -> dict[str, Any]:
    keys = ("seconds", "tokens_per_s", "samples_per_s")
    return {
        label: {
            **{
                key: dict(zip(("min", "median", "max"), spread([getattr(r, key) for r in rs])))
                for key in keys
            },
            "generated_tokens": rs[-1].generated,
            "steps": rs[-1].steps,
            "max_in_flight": rs[-1].in_flight,
        }
        for label, rs in runs.items()
    }


def say(line: str) -> None:
    print(f"[agent-bench] {line}", file=sys.stderr, flush=True)


# ---- main ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32, help="trajectories (one per prompt)")
    parser.add_argument("--tokens", type=int, default=512, help="single: max tokens of the one turn")
    parser.add_argument(
        "--budget", type=int, default=1024, help="multi: tokens per trajectory, inserted included"
    )
    parser.add_argument("--turns", type=int, default=4, help="multi: assistant turns per trajectory at most")
    parser.add_argument("--latency", default="0.05,0.5", help="multi: environment delay range, seconds")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each mode after a warm-up")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS, help="any of: " + ",".join(WORKLOADS))
    parser.add_argument(
        "--unseeded", action="store_true", help="sample without seeds (the paths then draw different tokens)"
    )
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 samples, short turns, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.tokens, args.budget, args.turns, args.repeats = 8, 64, 160, 3, 1
    workloads = args.workloads.split(",")
    if unknown := sorted(set(workloads) - set(WORKLOADS)):
        parser.error(f"--workloads: unknown {unknown}; choose from {list(WORKLOADS)}")
    low, high = (float(x) for x in args.latency.split(","))
    if args.turns < 2 or args.repeats < 1 or args.samples < 1 or not 0 <= low <= high:
        parser.error(
            "need --turns >= 2, --repeats >= 1, --samples >= 1 and --latency LOW,HIGH with 0 <= LOW <= HIGH"
        )

    tokenizer = build_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="tandem-agent-bench-"))
    folder = save_tiny(workdir / "model")
    prompts = make_prompts(tokenizer, args.samples, seed=0)
    longest_prompt = int(prompts["attention_mask"].sum(1).max())
    stops = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    # KV cache of the tiny model: 4 layers x (K + V) x 2 KV heads x 64 x 4 bytes = 4 KiB a token; 64
    # trajectories of ~1.1k tokens hold 0.3 GiB.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    say("starting vLLM")
    engine = VLLMRollout.from_pretrained(
        folder,
        max_model_len=longest_prompt + max(args.tokens, args.budget),
        eos_token_ids=stops,
        pad_token_id=tokenizer.pad_token_id,
    )
    seed = None if args.unseeded else SEED
    results: dict[str, Any] = {"args": vars(args)}
    print(
        f"tiny Qwen2 (hidden 256, 4 layers, fp32, random weights) on vLLM {engine_version()}, CPU, "
        f"{os.cpu_count()} cores; {args.samples} samples of 'a*b=' chat prompts, temperature {TEMPERATURE}, "
        f"stop ids <|endoftext|> <|im_end|>; {args.repeats} timed runs per mode after a warm-up"
    )

    if "single" in workloads:
        sampling = SamplingParams(max_tokens=args.tokens, temperature=TEMPERATURE, seed=seed)
        loop = AgentLoop(
            tokenizer,
            stops,
            settings=AgentSettings(max_assistant_turns=1),
            pad_token_id=tokenizer.pad_token_id,
        )
        runs = measure(
            "single",
            engine,
            {
                "sync": lambda: single_sync(engine, prompts, sampling),
                "async": lambda: agent_async(loop, engine, prompts, sampling),
            },
            args.repeats,
        )
        print(f"\n1. single turn, <= {args.tokens} tokens")
        print(f"response lengths: {distribution(runs['sync'][-1].turn_lengths)}")
        print_table(runs)
        print(same_work(runs, seed is not None))
        x = ratio(runs)
        print(
            f"verdict: async / sync = {x:.2f}x generated tok/s (medians): "
            + ("about equal" if abs(x - 1) < 0.1 else "async ahead" if x > 1 else "sync ahead")
            + " (one vLLM call already batches continuously: a finished sequence frees its slot)"
        )
        results["single"] = {**summary(runs), "async_over_sync": x}

    if "multi" in workloads:
        title = f"2. multi-turn, environment delay {low}-{high} s"
        results["multi"] = multi_turn(title, args, engine, tokenizer, prompts, seed, low, high)
    if "instant" in workloads:
        title = "3. multi-turn, environment answers at once (the turn barrier alone)"
        results["instant"] = multi_turn(title, args, engine, tokenizer, prompts, seed, 0.0, 0.0)

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        say(f"numbers in {args.json}")
    shutil.rmtree(workdir, ignore_errors=True)


def multi_turn(
    title: str,
    args: argparse.Namespace,
    engine: VLLMRollout,
    tokenizer: Any,
    prompts: Batch,
    seed: int | None,
    low: float,
    high: float,
) -> dict[str, Any]:
    """Workload "multi" (or "instant": no delay): turn-synchronous vs the agent loop; prints, returns numbers."""
    sampling = SamplingParams(max_tokens=args.budget, temperature=TEMPERATURE, seed=seed)
    settings = AgentSettings(max_assistant_turns=args.turns, max_user_turns=args.turns - 1)
    environment = SlowEnvironment(low, high, seed=SEED)
    inserter = ChatInserter(tokenizer, engine.eos_token_ids)
    loop = AgentLoop(
        tokenizer,
        engine.eos_token_ids,
        settings=settings,
        interaction=environment,
        pad_token_id=tokenizer.pad_token_id,
    )
    runs = measure(
        title.split(",")[0],
        engine,
        {
            "sync": lambda: turn_synchronous(
                engine, inserter, tokenizer, prompts, sampling, settings, environment
            ),
            "async": lambda: agent_async(loop, engine, prompts, sampling),
        },
        args.repeats,
    )
    sync, agent = runs["sync"][-1], runs["async"][-1]
    delays = [environment.delay(i, t) for i in range(args.samples) for t in range(1, args.turns)]
    print(
        f"\n{title}: <= {args.turns} assistant turns, <= {args.budget} tokens a trajectory, "
        f"'{REPLY}' inserted after every turn but the last"
    )
    print(f"model turn lengths: {distribution(agent.turn_lengths)}")
    print(f"generated tokens a trajectory: {distribution(agent.generated_per_sample)}")
    print(
        f"turns a trajectory: {distribution(agent.turns)}; finish: {dict(Counter(agent.finish))}; "
        f"inserted tokens {agent.inserted}"
    )
    print(
        f"environment delays drawn: mean {statistics.mean(delays):.3f} s; the sync path waited "
        f"{fmt([r.environment_s for r in runs['sync']], 2)} s at its barriers (min/med/max)"
    )
    print_table(runs)
    print(same_work(runs, seed is not None))
    x = ratio(runs)
    print(
        f"verdict: async / sync = {x:.2f}x generated tok/s (medians): "
        + ("async clearly ahead" if x >= 1.2 else "about equal" if x > 0.9 else "sync ahead")
        + f"; {sync.steps} engine steps turn-synchronous vs {agent.steps} continuously batched"
    )
    return {
        **summary(runs),
        "async_over_sync": x,
        "sync_environment_s": [r.environment_s for r in runs["sync"]],
    }


def engine_version() -> str:
    import vllm

    return vllm.__version__


if __name__ == "__main__":
    main()
