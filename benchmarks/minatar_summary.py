"""MinAtar at a glance (issue 48): final scores game x algorithm beside the published anchors, and rliable's
aggregate plots of anchor-normalised scores.

    python benchmarks/minatar_summary.py      # needs rliable: .venv/bin/pip install -c constraints.txt -e '.[bench]'

Reads the rows ``benchmarks/learning.py`` committed (``benchmarks/results/<name>.json``: per-seed final scores,
each the mean of the greedy evaluations over the last 10 % of the run's env steps) and writes
``benchmarks/results/minatar.md`` (the table), ``minatar-aggregates.png`` (IQM, median and mean of the
normalised scores with 95 % stratified-bootstrap CIs) and ``minatar-profiles.png`` (performance profiles).
A game an algorithm has no finished row for shows ``-`` (or the seeds a partial record holds, marked partial);
the aggregates are drawn twice: every game for the algorithms that have them all (``minatar-aggregates.png``,
``minatar-profiles.png``), and every algorithm on the games they all have (``-all`` beside them), each saying which.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from learning import RESULTS, numpy_global_seed, require_rliable  # benchmarks/ is the script's directory

GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
ALGOS = ("acer", "laser", "reactor")
COLORS = dict(zip(ALGOS, ("tab:blue", "tab:orange", "tab:green")))

# Young & Tian 2019 (MinAtar), read off the learning curves of the MinAtar repository (img/learning_curves.gif,
# 30 runs each): the moving average of training returns over 100 episodes at 5M frames (DQN's are
# epsilon-greedy, AC(0.8)'s the sampled policy's; ours are greedy evaluations). gymnax-blines' PPO at 10M steps
# (as issue 48 quotes them; none for Seaquest). Seaquest's curves are MinAtar <= 1.0.10 (the oxygen-bar bug).
ANCHORS = {
    "Asterix": {"DQN": 17.0, "AC(0.8)": 19.0, "PPO": 15.0},
    "Breakout": {"DQN": 10.0, "AC(0.8)": 17.5, "PPO": 28.0},
    "Freeway": {"DQN": 50.0, "AC(0.8)": 47.5, "PPO": 58.0},
    "Seaquest": {"DQN": 20.5, "AC(0.8)": 15.5, "PPO": None},
    "SpaceInvaders": {"DQN": 43.0, "AC(0.8)": 185.0, "PPO": 131.0},
}
NORMALISER = "AC(0.8)"

# The row that stands for an algorithm's preset on a game where its name is not ``<algo>-minatar-<game>``:
# LASER's preset took 4 updates a batch after its first Breakout row (settings/laser.py says why); ACER's Breakout
# row on the code with Atari frames stored once and the evaluator's fix (issue 45) replaces its first.
HEADLINE = {("laser", "Breakout"): "laser-minatar-breakout-updates4",
            ("acer", "Breakout"): "acer-minatar-breakout-framestore"}


def row_name(algo: str, game: str) -> str:
    return HEADLINE.get((algo, game), f"{algo}-minatar-{game.lower()}")


def finished_row(algo: str, game: str) -> dict | None:
    """The finished row's record (``learning.py``'s JSON), or None where there is none."""
    path = RESULTS / f"{row_name(algo, game)}.json"
    return json.loads(path.read_text()) if path.exists() else None


def finished_scores(algo: str, game: str) -> list[float] | None:
    """Per-seed final scores of the finished row, or None where there is none."""
    row = finished_row(algo, game)
    return None if row is None else [float(s) for s in row["final_score_per_seed"]]


def partial_scores(algo: str, game: str) -> list[float]:
    """Final scores of the seeds a partial record (``<row>-partial/seed<k>-summary.json``) holds."""
    folder = RESULTS / f"{row_name(algo, game)}-partial"
    summaries = sorted(folder.glob("seed*-summary.json")) if folder.exists() else []
    return [float(json.loads(p.read_text())["eval_return_mean"]) for p in summaries]


def cell(algo: str, game: str) -> str:
    row = finished_row(algo, game)
    if row is None:
        partial = partial_scores(algo, game)
        return f"partial: {', '.join(f'{s:.1f}' for s in partial)}" if partial else "-"
    (low, high), scores = row["final_score_ci95"], row["final_score_per_seed"]
    link = f"[{row['final_score_iqm']:.1f} [{low:.1f}, {high:.1f}]]({row_name(algo, game)}.png)"
    return f"{link}<br>{', '.join(f'{s:.1f}' for s in scores)}"


def three_seeds_note() -> str:
    """What a CI of 3 seeds says, for the table's rows that have 3 (:func:`learning.iqm_with_ci`)."""
    rows = [finished_scores(a, g) for a in ALGOS for g in GAMES]
    seeds = {len(r) for r in rows if r is not None}
    which = "Every row here has 3 seeds" if seeds == {3} else "A row of 3 seeds"
    return (f"{which}: its 95 % stratified-bootstrap CI is exactly [min, max] of them and its IQM their mean; the\n"
            "interval adds nothing to the seeds listed under it.")


def anchor(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table() -> str:
    head = "| game | " + " | ".join(ALGOS) + " | DQN (5M frames) | AC(0.8) (5M frames) | PPO (10M steps) |"
    lines = [head, "|" + "---|" * (len(ALGOS) + 4)]
    for game in GAMES:
        anchors = ANCHORS[game]
        cells = [cell(algo, game) for algo in ALGOS]
        lines.append(f"| {game} | " + " | ".join(cells) + " | "
                     + " | ".join(anchor(anchors[k]) for k in ("DQN", "AC(0.8)", "PPO")) + " |")
    return "\n".join(lines)


def normalised_matrices(algos: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """``{algo: [seeds, games]}`` of final scores over the AC(0.8) anchor, on the games every one of ``algos`` has."""
    common = [g for g in GAMES if all(finished_scores(a, g) is not None for a in algos)]
    matrices = {}
    for algo in algos:
        columns = [np.asarray(finished_scores(algo, g)) / ANCHORS[g][NORMALISER] for g in common]
        seeds = min(len(c) for c in columns)
        matrices[algo] = np.stack([c[:seeds] for c in columns], axis=1)
    return matrices, common


def plot_aggregates(matrices: dict[str, np.ndarray], games: list[str], path: Path) -> None:
    from rliable import library as rly
    from rliable import metrics, plot_utils

    def aggregates(x):
        return np.array([metrics.aggregate_median(x), metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])

    with numpy_global_seed(0):
        points, intervals = rly.get_interval_estimates(matrices, aggregates, reps=2_000)
    fig, _ = plot_utils.plot_interval_estimates(points, intervals, metric_names=["Median", "IQM", "Mean"],
                                                algorithms=list(matrices), colors=COLORS, row_height=0.6,
                                                xlabel=f"score / {NORMALISER} anchor", xlabel_y_coordinate=-0.3)
    fig.suptitle(f"MinAtar, 2M env steps: {', '.join(games)}", y=1.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")


def plot_profiles(matrices: dict[str, np.ndarray], games: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly
    from rliable import plot_utils

    taus = np.linspace(0.0, 2.5, 101)
    with numpy_global_seed(0):
        profiles, cis = rly.create_performance_profile(matrices, taus, reps=2_000)
    fig, ax = plt.subplots(figsize=(6, 4))
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, colors=COLORS, ax=ax,
                                         xlabel=rf"score / {NORMALISER} anchor $(\tau)$")
    ax.legend(handles=[plt.Line2D([], [], color=COLORS[a], lw=2, label=a) for a in matrices], loc="upper right")
    ax.set_title(f"MinAtar performance profiles\n{', '.join(games)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def aggregate_plots(algos: list[str], suffix: str) -> str:
    """The aggregate and profile plots of ``algos`` on the games they all have; the summary's line linking them."""
    matrices, games = normalised_matrices(algos)
    plot_aggregates(matrices, games, RESULTS / f"minatar-aggregates{suffix}.png")
    plot_profiles(matrices, games, RESULTS / f"minatar-profiles{suffix}.png")
    return (f"- {', '.join(algos)} on {', '.join(games)}: [IQM, median and mean with 95 % CIs]"
            f"(minatar-aggregates{suffix}.png), [performance profiles](minatar-profiles{suffix}.png)")


def main() -> None:
    require_rliable()
    complete = [a for a in ALGOS if all(finished_scores(a, g) is not None for g in GAMES)]
    plots = [aggregate_plots(complete, "")]  # every game, the algorithms that have them all
    if len(complete) < len(ALGOS):
        plots.append(aggregate_plots(list(ALGOS), "-all"))  # every algorithm, the games they all have
    plot_lines = "\n".join(plots)
    text = f"""# MinAtar: five games, three algorithms

Final scores at 2M env steps (each seed's mean greedy evaluation over the last 10 % of its env steps; IQM with its
95 % stratified-bootstrap CI over seeds, then every seed; the link is the row's curves), each algorithm's
`minatar` preset, beside the anchors. Rows, commands and machines: [learning.md](learning.md). Made by
`python benchmarks/minatar_summary.py`.

{table()}

{three_seeds_note()}

Anchors: Young & Tian 2019's DQN and AC(0.8), read off the MinAtar repository's learning curves at 5M frames
(moving average of training returns over 100 episodes: DQN's epsilon-greedy, AC's sampled; Seaquest's from
MinAtar <= 1.0.10); gymnax-blines' PPO at 10M steps. A cell marked partial lists the seeds of an unfinished
record (`<row>-partial/`). The anchors' protocol is not the rows': they are **training returns** of the acting
(exploring) policy, the rows **greedy evaluations**; Young & Tian's agents chose among **all 6 actions** (MinAtar's
`-v0`), the rows play the `-v1` ids, MinAtar's minimal action set of each game; MinAtar skips no frames, so a frame
is an env step: the DQN and AC(0.8) anchors come after 5M env steps, PPO's after 10M, the rows after 2M. They place a
row, they are not a like-for-like comparison. Every algorithm's row of a game is judged against the same bar,
{NORMALISER}'s (`--threshold` in learning.md; Reactor's first rows, run against DQN's, re-judged from their JSON).

Aggregates of the scores divided by the {NORMALISER} anchor, over the seeds and games each plot names (rliable, 2 000
stratified-bootstrap samples):
{plot_lines}
"""
    (RESULTS / "minatar.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
