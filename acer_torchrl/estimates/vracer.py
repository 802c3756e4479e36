"""V-RACER's stored estimates beside its loss (Novati & Koumoutsakos 2019, sec. 2, App. B, Algorithms 1 and 3).

:class:`~acer_torchrl.objectives.vracer.VRACERLoss` takes each sampled step's ``V^tbc_k`` and ``Q^ret_k`` from its
batch. Where they come from is here:

* **Stored estimates (sec. 2, Algorithm 3).** For every stored step ``k`` :class:`VRACEREstimates` keeps the most
  recent ``V(s_k)``, ``rho_k`` and ``V(s_{k+1})``, indexed by the replay's slot (:class:`SlotEstimates`, beside the
  replay rather than in it: each agent of a shared-replay sweep keeps its own); a step's are computed when it is
  first seen in the replay. A sampled step trains on ``V^tbc_k`` (value target, eq. 9) and
  ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 6-7 with ``Q := V``), eq. 8 run from its episode's last stored step
  over these stored values (:meth:`VRACEREstimates.before_update`); its fresh ``V`` and ``rho`` (and ``V(s_{k+1})``,
  the bootstrap where it is its episode's last stored step) are written back (:meth:`VRACEREstimates.after_update`).
  Terminal steps bootstrap on 0, a truncated (or still open) episode's last stored step on ``V(s_{T})``.
  Algorithm 3 stores ``V^tbc`` and recomputes it for every earlier step of the episode after each write-back
  (O(episode prefix) per sampled step); that keeps every stored ``V^tbc_t`` equal to eq. 8 over the stored
  values from ``t`` on, which is what is computed here when ``t`` is sampled (:meth:`VRACEREstimates.estimates`:
  a segment tree over eq. 8's affine steps, O(log replay) per sampled step, the same numbers as
  :func:`episode_targets`' loop over one episode).
* **Preprocessing (App. B).** States are standardised with the mean and std of the observations stored once
  there are ``N_start`` (eq. 14-15) by a :class:`~acer_torchrl.modules.Standardize` layer inside the network, so the acting
  policy on the workers receives it with the weights; rewards are divided by ``sigma_r = sqrt(mean r^2)`` over the
  replay (eq. 16), recomputed every ``reward_scale_interval`` gradient steps. When ``sigma_r`` changes, the stored
  values are rescaled by ``sigma_old / sigma_new`` so that they stay in the units of the current reward scale.
* **ReF-ER's ``beta`` (eq. 12)** follows the far-policy fraction of the stored ``rho``, counted here after each
  write-back and handed to the loss's :class:`~acer_torchrl.objectives.refer.ReFER`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from acer_torchrl.estimates.episode_recursion import EpisodeRecursion
from acer_torchrl.estimates.far_count import FarPolicyCount
from acer_torchrl.estimates.slots import SlotEstimates, as_array
from acer_torchrl.objectives.names import MASK_KEY, SLOT_KEY, WRITE_KEY
from acer_torchrl.objectives.vracer import VRACERLoss
from acer_torchrl.replay import EpisodeStore, write_index

if TYPE_CHECKING:
    from acer_torchrl.modules import Standardize

VALUE, RHO, NEXT_VALUE = "value", "rho", "next_value"  # a stored step's estimates (V(s_k), rho_k, V(s_{k+1}))
REWARD, TERMINAL = "reward", "terminal"  # a stored step's r_{k+1} and whether s_{k+1} is terminal (kept with them)
_WRITTEN_BACK = {VALUE: "state_value", RHO: "rho"}  # stored <- the loss's output (V(s_{k+1}): before_update's)

Terms = dict[str, np.ndarray]  # what eq. 8 reads at some steps, each [k]: see VRACEREstimates._eq8_terms


def eq8_maps(terms: Terms, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 8 as ``V^tbc_t = a_t V^tbc_{t+1} + b_t``: ``a_t = gamma rhō_t``, ``b_t = (1 - rhō_t) V_t + rhō_t r_{t+1}``;
    at an episode's last stored step ``a = 0`` and ``b`` adds ``rhō gamma V_boot``."""
    rho_bar, last = terms["rho_bar"], terms["last"]
    q_end = terms["reward"] + gamma * np.where(last, terms["bootstrap"], 0.0)
    a = np.where(last, 0.0, gamma * rho_bar)
    b = (1.0 - rho_bar) * terms["value"] + rho_bar * q_end
    return a, b


def eq8_targets(terms: Terms, after: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """``V^tbc_k`` and ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 6, 8 with ``Q := V``) of the steps of ``terms``,
    from ``after``, their ``V^tbc_{k+1}`` (read only where the step is not its episode's last: the bootstrap there)."""
    q_ret = terms["reward"] + gamma * np.where(terms["last"], terms["bootstrap"], after)
    v_tbc = terms["value"] + terms["rho_bar"] * (q_ret - terms["value"])
    return v_tbc, q_ret


def episode_targets(value: torch.Tensor, rho: torch.Tensor, reward: torch.Tensor, bootstrap: float,
                    gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``V^tbc_t`` and ``Q^ret_t`` of every step of one episode, each ``[T]`` (float32): eq. 8,
    ``V^tbc_t = V_t + rhō_t [r_{t+1} + gamma V^tbc_{t+1} - V_t]`` with ``rhō_t = min(1, rho_t)``, run backwards
    from its last step, and ``Q^ret_t = r_{t+1} + gamma V^tbc_{t+1}`` (eq. 6 with ``Q := V``).

    ``value``, ``rho``, ``reward``: the stored ``V(s_t)``, ``rho_t`` and ``r_{t+1}`` (scaled as the values are:
    ``r / sigma_r`` in V-RACER, App. B) of the episode's steps in time order, ``[T]``; ``bootstrap``: ``V^tbc`` after
    its last step, 0 when that step is terminal, else ``V(s_T)``. What :class:`VRACEREstimates` gives a sampled step
    (from a segment tree over the replay's episodes instead of this loop), for use without this package's replay."""
    terms = {"value": as_array(value).reshape(-1), "reward": as_array(reward).reshape(-1)}
    steps = terms["value"].size
    terms["rho_bar"] = np.minimum(as_array(rho).reshape(-1), 1.0)
    terms["last"] = np.arange(steps) == steps - 1
    terms["bootstrap"] = np.full(steps, bootstrap, dtype=terms["value"].dtype)
    a, b = eq8_maps(terms, gamma)
    following = np.zeros(steps + 1)  # V^tbc_t for t = 0..T (V^tbc_T unused: a = 0 at the last step), float64
    for t in reversed(range(steps)):
        following[t] = a[t] * following[t + 1] + b[t]
    return tuple(torch.from_numpy(x) for x in eq8_targets(terms, following[1:].astype(terms["value"].dtype), gamma))


class VRACEREstimates:
    """The stored estimates of one V-RACER agent, the state and reward statistics (App. B) and the ``beta``
    controller's far-policy count (eq. 12), kept beside ``loss`` and the replay (see the module's docstring).

    The trainer calls :meth:`after_extend` after each collected batch is stored, :meth:`before_update` on each drawn
    batch (it adds ``V^tbc`` and ``Q^ret`` under ``loss.tensor_keys``) and :meth:`after_update` after each optimiser
    step (Algorithm 3's write-back, ``sigma_r``, ``beta``). :meth:`state_dict` goes into the run's checkpoint.

    Args:
        loss: the agent's loss: its network's fresh estimates (:meth:`VRACERLoss.fresh_estimates`), its keys and
            its :class:`~acer_torchrl.objectives.refer.ReFER` (``c_max``, the ``beta`` step).
        normalizer: the :class:`~acer_torchrl.modules.Standardize` layer inside ``loss.network``.
        gamma: discount.
        n_start: stored steps before the state and reward statistics are fitted (``N_start``, Alg. 1; the trainer
            starts updating at ``replay.min_size``, pass that).
        reward_scale_interval, epsilon: the fields of :class:`VRACERConfig`.
        reward_key, terminated_key: a stored step's ``r_{k+1}`` and whether ``s_{k+1}`` is terminal.
    """

    out_keys = ("next_state_value", "reward_scale")  # what after_update adds to an update's output (names.OUTPUTS)
    value_keys = ("next_state_value",)  # of which a value estimate

    def __init__(self, loss: VRACERLoss, normalizer: Standardize, *, gamma: float = 0.99, n_start: int,
                 reward_scale_interval: int = 1000, epsilon: float = 1e-7,
                 reward_key: NestedKey = ("next", "reward"), terminated_key: NestedKey = ("next", "terminated")):
        self.loss = loss
        self.normalizer = normalizer
        self.gamma = gamma
        self.n_start = n_start
        self.reward_scale_interval = reward_scale_interval
        self.epsilon = epsilon
        self.reward_key, self.terminated_key = reward_key, terminated_key
        self.reward_scale = torch.tensor(1.0)  # sigma_r (eq. 16)
        self.fitted = torch.tensor(False)  # state/reward statistics fitted (Alg. 1)
        self.updates = torch.tensor(0, dtype=torch.long)  # gradient steps k
        self.stored = SlotEstimates()  # V, rho, V(s_{k+1}), r and terminal of every stored step, by slot
        self._far = FarPolicyCount()  # eq. 12's far-policy count over the stored rho
        self._recursion: EpisodeRecursion | None = None  # eq. 8 over the stored steps (None: to be built)
        self._drawn: tuple[np.ndarray, Terms, np.ndarray | slice, np.ndarray] | None = None  # see before_update

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """Checkpoint content (tensors and plain containers only): the statistics and the stored columns."""
        return {"reward_scale": self.reward_scale, "fitted": self.fitted, "updates": self.updates,
                "stored": self.stored.state()}

    def load_state_dict(self, state: dict) -> None:
        for name in ("reward_scale", "fitted", "updates"):
            getattr(self, name).copy_(state[name])
        self.stored = SlotEstimates()
        if "stored" in state:  # (a weights file, init_from, keeps the statistics alone: its steps are the new run's)
            self.stored.load_state(state["stored"])
        self._far = FarPolicyCount()
        self._recursion = self._drawn = None

    # ------------------------------------------------------------------ trainer hooks
    def after_extend(self, replay: EpisodeStore) -> None:
        """The new steps' estimates (:meth:`sync`); once ``n_start`` steps are stored, the state and reward
        statistics are fitted and every stored value recomputed (Algorithm 1)."""
        self.sync(replay)

    def sync(self, replay: EpisodeStore) -> None:
        """Estimates for the steps written into ``replay`` since the last look (the agent's own collected ones,
        or, in a shared replay, anyone's): ``V(s_k)``, ``rho_k`` and ``V(s_{k+1})`` of the current network (what
        Algorithm 1 stores with a new step), with their reward and terminal flag."""
        new = self.stored.sync(replay)
        if new is None:
            return
        if new.numel():
            self._store_fresh(replay, new)
        if self._recursion is not None:  # episodes were added or evicted
            self._recursion.refresh(self.stored.links, new, self._eq8_maps_at)
        if not bool(self.fitted) and self.stored.links.alive.sum() >= self.n_start:
            self._fit(replay)

    def _fresh(self, steps: TensorDictBase) -> dict[str, torch.Tensor]:
        return dict(zip((VALUE, RHO, NEXT_VALUE), self.loss.fresh_estimates(steps)))

    def _store_fresh(self, replay: EpisodeStore, slots: torch.Tensor) -> None:
        steps = replay.gather(slots, [*self.loss.fresh_estimate_keys, self.reward_key, self.terminated_key])
        recorded = {REWARD: steps.get(self.reward_key), TERMINAL: steps.get(self.terminated_key)}
        self.stored.write(slots, **self._fresh(steps), **recorded)

    def before_update(self, sample: TensorDictBase, replay: EpisodeStore) -> TensorDictBase:
        """Adds the sampled steps' ``V^tbc`` and ``Q^ret`` (:meth:`estimates`) under the loss's ``value_target`` and
        ``q_ret`` keys, and keeps the ``V(s_{k+1})`` to write back (:meth:`_bootstrap_values`).

        In a shared replay the other agents write while this one draws: a step replaced in its slot between the
        draw and this look (the sample holds the old step, the stored estimates are now the new one's) is masked
        out of this update and not written back (:meth:`_still_stored`)."""
        self.sync(replay)  # in a shared replay, steps others wrote since this agent's last look
        slots = as_array(sample.get(SLOT_KEY)).reshape(-1)
        kept = self._still_stored(sample, slots)
        if isinstance(kept, np.ndarray):
            sample.set(MASK_KEY, torch.from_numpy(kept).reshape(sample.shape).to(sample.device))
        terms = self._eq8_terms(slots)
        v_tbc, q_ret = self._targets(slots, terms)
        # after_update's eq. 8 maps: these steps' terms with the written-back values
        self._drawn = slots, terms, kept, self._bootstrap_values(replay, slots, terms)
        keys = self.loss.tensor_keys
        for key, value in ((keys.value_target, v_tbc), (keys.q_ret, q_ret)):
            sample.set(key, torch.from_numpy(value).reshape(*sample.shape, 1).to(sample.device))
        return sample

    def _still_stored(self, sample: TensorDictBase, slots: np.ndarray) -> np.ndarray | slice:
        """Which sampled steps still hold their slots as of the last :meth:`sync` (bool ``[k]``), or
        ``slice(None)`` when all do (always, but in a shared replay): the write that stored each when it was
        drawn (``"write_index"``, set by the replay's ``sample_steps``; a batch without it is taken as current)
        against the last write into its slot."""
        drawn_as = sample.get(WRITE_KEY, None)
        if drawn_as is None:
            return slice(None)
        kept = write_index(slots, self.stored.synced, self.stored.capacity) == as_array(drawn_as).reshape(-1)
        return slice(None) if kept.all() else kept

    @torch.no_grad()
    def _bootstrap_values(self, replay: EpisodeStore, slots: np.ndarray, terms: Terms) -> np.ndarray:
        """``V(s_{k+1})`` of the sampled steps to write back, ``[k]`` on the CPU: the current network's where
        ``k`` is its episode's last stored step and not terminal (eq. 8's bootstrap: the only place the stored
        ``V(s_{k+1})`` is read), the stored one elsewhere. Evaluated before the optimiser step, as Algorithm 3's
        write-back of the values of its gradient pass; ``s_{k+1}`` gathered and evaluated for those few steps
        only, not for every step of the batch."""
        values = terms["next_value"].copy()
        rows = np.flatnonzero(terms["last"] & ~terms["terminal"])
        if rows.size:
            ends = replay.gather(torch.from_numpy(slots[rows]), [("next", k) for k in self.loss.network.in_keys])
            values[rows] = as_array(self.loss.next_value(ends)).reshape(-1)
        return values

    def after_update(self, sample: TensorDictBase, output: TensorDictBase, replay: EpisodeStore) -> None:
        """Algorithm 3's write-back, the ``sigma_r`` refresh (Algorithm 1) and ReF-ER's ``beta`` (eq. 12); adds to
        ``output`` the ``V(s_{k+1})`` written back (``next_state_value``) and the ``sigma_r`` the update's targets
        were computed with (``reward_scale``).

        The sampled steps get the fresh ``V(s_k)``, ``rho_k`` of ``output`` and the ``V(s_{k+1})`` of
        :meth:`before_update` (used only at an episode's last stored step: the bootstrap of eq. 8 there), except
        those replaced before :meth:`before_update` looked. (A step replaced after it looked gets the new step's
        estimates at the next :meth:`sync`, which overwrites what is written here.)"""
        slots, drawn, kept, next_value = self._drawn_for(sample)
        output.set("next_state_value", torch.from_numpy(next_value).reshape(*sample.shape, 1).to(output.device))
        output.set("reward_scale", self.reward_scale.clone())
        slots = slots[kept]
        fresh = {name: as_array(output.get(out_key)).reshape(-1)[kept] for name, out_key in _WRITTEN_BACK.items()}
        version = self.stored.version
        self.stored.write(slots, **fresh, **{NEXT_VALUE: next_value[kept]})
        self._far.rewritten(slots, self.stored.array(RHO), version, self.stored.version)
        if self._recursion is not None:
            # eq. 8's terms at the written slots: before_update's (reward, episode end, terminal: unchanged)
            # with the stored V, rho and V(s_{k+1}) now written back
            drawn = {name: value[kept] for name, value in drawn.items()}
            terms = {**drawn, **self._written_terms(slots, drawn["terminal"])}
            self._recursion.set(slots, *eq8_maps(terms, self.gamma))
        self.updates += 1
        if int(self.updates) % self.reward_scale_interval == 0:
            self._rescale_rewards()
        rho, alive = self.stored.written(RHO)  # eq. 12's n_far / N over the replay's latest weights
        refer = self.loss.refer
        refer.step_beta(self._far.share(rho.numpy(), alive.numpy(), refer.c_max, self.stored.version))

    def _drawn_for(self, sample: TensorDictBase) -> tuple[np.ndarray, Terms, np.ndarray | slice, np.ndarray]:
        """:meth:`before_update`'s slots, eq. 8 terms, kept rows and ``V(s_{k+1})`` for ``sample``."""
        if self._drawn is None or not np.array_equal(self._drawn[0], as_array(sample.get(SLOT_KEY)).reshape(-1)):
            raise RuntimeError("VRACEREstimates.after_update: the sample is not the one before_update prepared")
        return self._drawn

    # ------------------------------------------------------------------ eq. 8 over the stored estimates
    def _eq8_terms(self, slots: np.ndarray) -> Terms:
        """What eq. 8 reads at ``slots``, each ``[k]``: the stored ``V`` and ``rhō = min(1, rho)``, the
        reward scaled by ``sigma_r`` (App. B), whether the step is its episode's last stored one, and the
        bootstrap there (0 when terminal, else the stored ``V(s_{k+1})``). In NumPy, as the rest of the
        stored-estimate bookkeeping: a few hundred entries an update, where a NumPy call costs a fraction of a
        torch call (the same float32 arithmetic)."""
        terminal = self.stored.array(TERMINAL)[slots]
        return {
            "reward": self.stored.array(REWARD)[slots] / (float(self.reward_scale) + self.epsilon),
            "last": self.stored.links.next.numpy()[slots] < 0,
            "terminal": terminal,
            **self._written_terms(slots, terminal),
        }

    def _written_terms(self, slots: np.ndarray, terminal: np.ndarray) -> Terms:
        """The terms of :meth:`_eq8_terms` that the write-back changes: the stored ``V``, ``rhō`` and ``V(s_{k+1})``,
        and the bootstrap (0 where ``terminal``)."""
        value, rho, next_value = (self.stored.array(name)[slots] for name in (VALUE, RHO, NEXT_VALUE))
        bootstrap = np.where(terminal, 0.0, next_value)
        return {"value": value, "rho_bar": np.minimum(rho, 1.0), "next_value": next_value, "bootstrap": bootstrap}

    def _eq8_maps_at(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`eq8_maps` of the stored steps ``slots``."""
        return eq8_maps(self._eq8_terms(slots), self.gamma)

    def _stored_recursion(self) -> EpisodeRecursion:
        """Eq. 8's maps of every stored step in episode order, in a segment tree; built at the first query (and after
        every stored value changed: fitting, a new ``sigma_r``), then kept current by :meth:`sync` (steps stored or
        evicted) and :meth:`after_update` (values written back)."""
        if self._recursion is None:
            self._recursion = EpisodeRecursion(self.stored.links, self._eq8_maps_at)
        return self._recursion

    @torch.no_grad()
    def estimates(self, replay: EpisodeStore, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``V^tbc_k`` and ``Q^ret_k`` of the stored steps ``slots`` (``[k]``), each ``[k, 1]``.

        Eq. 8, ``V^tbc_t = V_t + rhō_t [r_{t+1} + gamma V^tbc_{t+1} - V_t]``, run backwards from the episode's
        last stored step (bootstrap: 0 when terminal, else the stored ``V(s_{T})``) over the stored ``V`` and
        ``rho``; ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 6 with ``Q := V``). These are the values
        Algorithm 3 would hold for ``k``: it recomputes a step's ``V^tbc`` whenever a later step of its
        episode is written back. ``V^tbc_{k+1}`` is the suffix of the episode-ordered recursion
        (:class:`EpisodeRecursion`, the episode's last step cutting it), O(log n) per step instead of the
        O(episode) of a backward pass (:func:`episode_targets`)."""
        self.sync(replay)
        slots = as_array(slots)
        return tuple(torch.from_numpy(x).unsqueeze(-1) for x in self._targets(slots, self._eq8_terms(slots)))

    def _targets(self, slots: np.ndarray, terms: Terms) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`estimates` from the eq. 8 terms of ``slots``, each ``[k]``."""
        after = self._stored_recursion().suffix_after(slots).numpy().astype(terms["value"].dtype)  # V^tbc_{k+1}
        return eq8_targets(terms, after, self.gamma)

    # ------------------------------------------------------------------ statistics (App. B)
    @torch.no_grad()
    def _fit(self, replay: EpisodeStore) -> None:
        """Algorithm 1's preparation: state statistics (eq. 14-15) and ``sigma_r`` (eq. 16) from the stored
        steps, then every stored value recomputed with the standardised network."""
        slots = self.stored.alive_slots()
        steps = replay.gather(slots, self.loss.fresh_estimate_keys)
        self.normalizer.fit(steps.get("observation").flatten(1).float())
        self.reward_scale.copy_(self._reward_rms())
        self.stored.write(slots, **self._fresh(steps))
        self._recursion = None
        self.fitted.fill_(True)

    def _reward_rms(self) -> torch.Tensor:
        """``sigma_r = sqrt(mean_t r_{t+1}^2)`` over the stored steps (eq. 16)."""
        reward, alive = self.stored.written(REWARD)
        return reward[alive].float().pow(2).mean().sqrt()

    @torch.no_grad()
    def _rescale_rewards(self) -> None:
        """Recompute ``sigma_r`` (eq. 16) and convert the stored values to the new reward units."""
        new = float(self._reward_rms())
        self.stored.scale((float(self.reward_scale) + self.epsilon) / (new + self.epsilon), VALUE, NEXT_VALUE)
        self.reward_scale.fill_(new)
        self._recursion = None
