"""Environments: classic control, MuJoCo v5, Atari (ale-py) and MinAtar, as TorchRL envs.

Cheap per-env work happens below TorchRL, in numpy: gymnasium's time limit, CartPole's POMDP mask,
the float64 -> float32 cast of MuJoCo observations and MinAtar's channel-first uint8 frames are gymnasium
wrappers, and Atari's standard DQN
preprocessing (no-op starts, frame skip with a max-pool of the last two frames, 84x84 grey uint8 frames,
frame stack) is done by ale-py's C++ vector env, without OpenCV. TorchRL wraps the result
(``GymWrapper``) and appends ``InitTracker`` ("is_init"), ``StepCounter`` ("step_count"), ``RewardSum``
("episode_reward") and any extra transforms (e.g. the primers of recurrent policies). Each TorchRL
transform costs as much per (batched) step as ten CartPole steps, hence this split.

Several envs per collector worker (``EnvConfig.num_envs > 1``) are stepped together in one TorchRL env:
gymnasium's ``SyncVectorEnv`` (or ale-py's vector env) with autoreset disabled, TorchRL resetting the
finished envs through its ``"_reset"`` mask. That env has ``batch_size == [num_envs]`` and the collected
batches are ``[num_envs, T]``; with ``num_envs == 1`` it has ``batch_size == []`` and batches are ``[T]``.
One batched env amortises TorchRL's per-step cost and batches the policy's inference (see
``benchmarks/results/throughput.md``).

Discrete actions are integer indices (``categorical_action_encoding``). Continuous actions are clipped to the
action space's bounds before the env steps (:class:`_ClippedActions`): MuJoCo clamps its controls, but gymnasium's
MuJoCo tasks charge their control cost on the action as given (HalfCheetah-v5: -0.1 |a|^2, -240 a step for an
action of 20 in each joint, -0.6 for 1). The collected batch keeps the policy's own sample, which the losses'
importance weights need. A time limit ends an episode with ``truncated=True, terminated=False``.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import gymnasium as gym
import mujoco
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torchrl.envs import EnvBase, GymWrapper, InitTracker, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.transforms import Transform

from acer_torchrl.settings.env import EnvConfig
from acer_torchrl.validation import check_allowed

if TYPE_CHECKING:
    from acer_torchrl.atari import ManualResetAtariVectorEnv

FAMILIES = (
    "classic control (CartPole-v1, Acrobot-v1, Pendulum-v1, ...), "
    "MuJoCo v5 (Hopper-v5, HalfCheetah-v5, Walker2d-v5, ...), "
    "Atari through ale-py (ALE/Pong-v5, ALE/Breakout-v5, ...), "
    "MinAtar (MinAtar/Breakout-v1, MinAtar/Seaquest-v1, ...; -v0: all 6 actions)"
)
_CARTPOLE_POSITIONS = [0, 2]  # cart position x and pole angle theta; 1 and 3 are their velocities
MINATAR_PREFIX = "MinAtar/"
MINATAR_GRID = (10, 10)  # every MinAtar game is a 10x10 grid of 0/1 channels (Young & Tian 2019, sec. 2)
# Only Freeway ends on time (2 500 frames); the other games can go on forever once the agent is good (e.g.
# Breakout refills its bricks), so a limit bounds each episode and each greedy evaluation: 10 000 steps (no
# frame skip in MinAtar: frames too), far beyond a random agent's ~12-step Breakout episode. Reaching it
# truncates the episode (the value bootstraps), as gymnasium's time limits do.
MINATAR_MAX_EPISODE_STEPS = 10_000


@dataclass(frozen=True)
class EnvInfo:
    """What networks need to know about an env, read from its TorchRL specs."""

    obs_shape: tuple[int, ...]  # one env's observation ("observation"), without batch dims
    obs_dtype: torch.dtype
    discrete: bool
    num_actions: int | None = None  # discrete: actions are integer indices in [0, num_actions)
    action_dim: int | None = None  # continuous: size of the action vector
    action_low: tuple[float, ...] | None = None  # continuous: bounds of the action space
    action_high: tuple[float, ...] | None = None


def _register_minatar() -> None:
    """Registers the ``MinAtar/<Game>-v0/v1`` ids with gymnasium (the minatar package does not on import:
    its ``gymnasium.envs`` entry point is not loaded by gymnasium 1.x). Imported only for MinAtar runs:
    minatar imports matplotlib's pyplot and seaborn (hence pandas)."""
    if f"{MINATAR_PREFIX}Breakout-v1" in gym.registry:
        return
    try:
        from minatar.gym import register_envs
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] != "minatar":
            raise
        raise ValueError("MinAtar envs need the minatar package: pip install minatar") from None
    register_envs()


def _register_atari() -> bool:
    """Registers ale-py's Atari ids (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, ...) with gymnasium, once; True
    when that added ids. Done on demand, for an id gymnasium does not know: ale-py's import costs ~0.2 s in
    every process that builds an env."""
    if "ALE/Pong-v5" in gym.registry:
        return False
    import ale_py

    gym.register_envs(ale_py)
    return True


def env_family(name: str) -> str:
    """``"classic"``, ``"mujoco"``, ``"atari"`` or ``"minatar"``; a ``ValueError`` naming ``env.name`` otherwise."""
    if name.startswith(MINATAR_PREFIX):
        _register_minatar()
    spec = gym.registry.get(name)
    if spec is None and _register_atari():
        spec = gym.registry.get(name)
    entry = spec.entry_point if spec is not None else None
    if isinstance(entry, str):
        if entry.startswith("gymnasium.envs.classic_control."):
            return "classic"
        if entry.startswith("gymnasium.envs.mujoco."):
            if spec.version != 5:
                raise ValueError(f"env.name {name!r}: only MuJoCo v5 tasks are supported, use '{spec.name}-v5'")
            return "mujoco"
        if entry == "ale_py.env:AtariEnv":
            if spec.kwargs.get("obs_type", "rgb") != "rgb":
                raise ValueError(f"env.name {name!r}: Atari ids with RAM/grey observations are not supported, use e.g. 'ALE/Pong-v5'")
            return "atari"
        if entry == "minatar.gym:BaseEnv":
            return "minatar"
    raise ValueError(f"unknown env.name {name!r}: supported families are {FAMILIES}")


OBSERVATION_KINDS = {"classic": "vector", "mujoco": "vector", "atari": "pixel", "minatar": "grid"}


def observation_kind(name: str) -> str:
    """What env ``name`` observes: ``"vector"`` (classic control, MuJoCo), ``"pixel"`` (Atari frame stacks) or
    ``"grid"`` (MinAtar); a preset's networks and replay fit one kind."""
    return OBSERVATION_KINDS[env_family(name)]


def discrete_actions(name: str) -> bool:
    """Whether env ``name``'s actions are discrete: Atari's and MinAtar's are, MuJoCo's are not; a classic-control
    env (CartPole and Pendulum alike) is made to read its action space (a few milliseconds)."""
    family = env_family(name)
    if family != "classic":
        return family in ("atari", "minatar")
    env = gym.make(name)
    try:
        return isinstance(env.action_space, gym.spaces.Discrete)
    finally:
        env.close()


def _validate(cfg: EnvConfig) -> None:
    check_allowed(cfg, "env.")
    if cfg.pomdp and cfg.name != "CartPole-v1":
        raise ValueError(f"env.pomdp=true is defined for CartPole-v1 only (got env.name {cfg.name!r})")


class _VectorObservation(gym.ObservationWrapper):
    """Keeps the observation entries ``keep`` (all when ``None``) as float32."""

    def __init__(self, env: gym.Env, keep: list[int] | None = None):
        super().__init__(env)
        self.keep = slice(None) if keep is None else keep
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            space.low[self.keep].astype(np.float32), space.high[self.keep].astype(np.float32), dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep].astype(np.float32, copy=False)


@contextlib.contextmanager
def _quiet_mujoco_compiler() -> Iterator[None]:
    """Drops MuJoCo's known-harmless deprecation warning about gymnasium's own HalfCheetah model
    (``settotalmass``), printed once per env otherwise; other MuJoCo warnings still reach stderr."""

    def warn(message: str) -> None:
        if "settotalmass" not in message:
            sys.stderr.write(f"WARNING: {message}\n")

    mujoco.set_mju_user_warning(warn)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(None)


class _ChannelFirstFrames(gym.ObservationWrapper):
    """MinAtar's bool ``[10, 10, C]`` grids as uint8 ``[C, 10, 10]`` (0/1): the layout of ``nn.Conv2d``,
    one byte a cell in the replay; the encoder converts them to float on the learner's device."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        height, width, channels = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (channels, height, width), dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(observation.view(np.uint8).transpose(2, 0, 1))


def _make_minatar_env(cfg: EnvConfig) -> gym.Env:
    """One MinAtar game: sticky actions (MinAtar's 0.1 unless ``env.repeat_action_probability``), the time
    limit (``env.max_episode_steps``, else :data:`MINATAR_MAX_EPISODE_STEPS`), channel-first uint8 frames."""
    rap = cfg.repeat_action_probability
    with warnings.catch_warnings():  # "-v0 is out of date": here -v0 is the full action set, not an old version
        warnings.filterwarnings("ignore", ".*MinAtar/.* is out of date", DeprecationWarning)
        env = gym.make(
            cfg.name,
            max_episode_steps=cfg.max_episode_steps or MINATAR_MAX_EPISODE_STEPS,
            disable_env_checker=True,
            **({} if rap is None else {"sticky_action_prob": rap}),
        )
    return _ChannelFirstFrames(env)


class _ClippedActions(gym.ActionWrapper):
    """A continuous action clipped to the action space's bounds on its way to the env, which keeps its bounded action
    space (gymnasium's ``ClipAction`` makes it unbounded, and the policies read the bounds from it)."""

    def action(self, action: np.ndarray) -> np.ndarray:
        return np.clip(action, self.action_space.low, self.action_space.high)


def _make_gym_env(cfg: EnvConfig) -> gym.Env:
    """One classic-control, MuJoCo or MinAtar gymnasium env with the time limit, POMDP mask and float32 cast, its
    continuous actions clipped to their bounds."""
    if cfg.name.startswith(MINATAR_PREFIX):
        return _make_minatar_env(cfg)
    with _quiet_mujoco_compiler():
        env = gym.make(cfg.name, max_episode_steps=cfg.max_episode_steps, disable_env_checker=True)
    if isinstance(env.action_space, gym.spaces.Box):
        env = _ClippedActions(env)
    if cfg.pomdp or env.observation_space.dtype != np.float32:
        env = _VectorObservation(env, _CARTPOLE_POSITIONS if cfg.pomdp else None)
    return env


class _SingleEnvView(gym.Env):
    """A one-env vector env seen as a plain gymnasium env (TorchRL batch size ``[]``)."""

    def __init__(self, vector_env: gym.vector.VectorEnv):
        self.vector_env = vector_env
        self.observation_space = vector_env.single_observation_space
        self.action_space = vector_env.single_action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.vector_env.reset(seed=seed, options=options)
        return obs[0], {k: v[0] for k, v in info.items()}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.vector_env.step(np.asarray(action).reshape(1))
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {k: v[0] for k, v in info.items()}

    def close(self):
        self.vector_env.close()


def atari_vector_env(cfg: EnvConfig, num_envs: int) -> ManualResetAtariVectorEnv:
    """The gymnasium-level Atari env of ``cfg`` (``num_envs`` games, standard DQN preprocessing)."""
    from acer_torchrl.atari import ManualResetAtariVectorEnv

    _register_atari()
    kwargs = gym.registry[cfg.name].kwargs
    max_frames = kwargs["max_num_frames_per_episode"]
    if cfg.max_episode_steps is not None:
        max_frames = cfg.max_episode_steps * cfg.frame_skip
    rap = cfg.repeat_action_probability
    return ManualResetAtariVectorEnv(
        game=kwargs["game"],
        num_envs=num_envs,
        num_threads=1,  # the collector's worker processes are the parallelism
        frameskip=cfg.frame_skip,
        maxpool=True,
        noop_max=cfg.noop_max,
        episodic_life=cfg.episodic_life,  # see ManualResetAtariVectorEnv
        stack_num=cfg.frame_stack,
        img_height=84,
        img_width=84,
        grayscale=True,
        max_num_frames_per_episode=max_frames,
        repeat_action_probability=kwargs["repeat_action_probability"] if rap is None else rap,
        full_action_space=kwargs.get("full_action_space", False),
        reward_clipping=False,  # raw rewards: episode returns are reported unclipped; losses may clip
        use_fire_reset=False,
    )


def _base_env(cfg: EnvConfig, family: str, device) -> EnvBase:
    if family == "atari":
        gym_env = atari_vector_env(cfg, cfg.num_envs)
        if cfg.num_envs == 1:
            gym_env = _SingleEnvView(gym_env)
    elif cfg.num_envs == 1:
        gym_env = _make_gym_env(cfg)
    else:
        gym_env = SyncVectorEnv([partial(_make_gym_env, cfg)] * cfg.num_envs, autoreset_mode=AutoresetMode.DISABLED)
    return GymWrapper(gym_env, categorical_action_encoding=True, device=device)


def make_env(
    cfg: EnvConfig,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    extra_transforms: Sequence[Transform] = (),
) -> TransformedEnv:
    """The TorchRL env of ``cfg``: observation under ``"observation"``, plus "is_init", "step_count" and
    "episode_reward" in every step. ``extra_transforms`` (e.g. ``lstm.make_tensordict_primer()``) are
    appended last; they are cloned, so the same list can build many envs. ``seed`` seeds the env (its
    ``num_envs`` games get ``seed, seed + 1, ...``).
    """
    family = env_family(cfg.name)
    _validate(cfg)
    env = TransformedEnv(_base_env(cfg, family, device), InitTracker())
    env.append_transform(StepCounter())
    env.append_transform(RewardSum())
    for transform in extra_transforms:
        env.append_transform(transform.clone())
    if seed is not None:
        env.set_seed(seed)
    return env


def make_env_fn(
    cfg: EnvConfig, seed: int | None = None, extra_transforms: Sequence[Transform] = ()
) -> Callable[[], TransformedEnv]:
    """A picklable zero-argument env factory (for collector workers)."""
    return partial(make_env, cfg, seed, "cpu", tuple(extra_transforms))


def env_info(cfg: EnvConfig) -> EnvInfo:
    """Observation and action facts of ``cfg``'s env (builds one env with one game, reads its specs)."""
    env = make_env(replace(cfg, num_envs=1))
    try:
        obs = env.observation_spec["observation"]
        action = env.action_spec
        common = {"obs_shape": tuple(obs.shape), "obs_dtype": obs.dtype}
        if action.domain == "discrete":
            return EnvInfo(**common, discrete=True, num_actions=int(action.space.n))
        return EnvInfo(
            **common,
            discrete=False,
            action_dim=int(action.shape[-1]),
            action_low=tuple(action.space.low.tolist()),
            action_high=tuple(action.space.high.tolist()),
        )
    finally:
        env.close()


def stacked_frames(cfg: EnvConfig) -> int:
    """``k`` when the env's observation is a stack of its last ``k`` frames (Atari), else 1: what the replay
    needs to store each frame once (:class:`~acer_torchrl.frame_store.FrameStore`)."""
    return cfg.frame_stack if env_family(cfg.name) == "atari" else 1


def validate_env_config(cfg: EnvConfig) -> None:
    """Check ``cfg`` without building an env: a ``ValueError`` with one line naming the key otherwise."""
    env_family(cfg.name)
    _validate(cfg)
