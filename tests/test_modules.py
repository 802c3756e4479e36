"""The acting policy's sampler against torch's own distributions (and V-RACER's truncated normal); a chain of
networks called through ``NetworkCall`` against its TensorDict calls."""

import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type

from acer_torchrl.modules import BehaviourSampler, GaussianHead, TruncatedGaussian
from acer_torchrl.objectives.network_call import NetworkCall


def test_discrete_draws_are_categoricals_draws_with_their_log_prob():
    logits = torch.randn(7, 5, 3)
    torch.manual_seed(3)
    action, log_prob = BehaviourSampler(discrete=True)(logits)
    torch.manual_seed(3)
    dist = torch.distributions.Categorical(logits=logits)
    expected = dist.sample()
    assert action.shape == (7, 5) and action.dtype == torch.long
    torch.testing.assert_close(action, expected)
    torch.testing.assert_close(log_prob, dist.log_prob(expected))


def test_discrete_frequencies_follow_the_policy():
    logits = torch.tensor([1.0, -0.5, 0.3]).expand(200_000, 3)
    action, _ = BehaviourSampler(discrete=True)(logits)
    freq = torch.bincount(action, minlength=3).double() / action.numel()
    torch.testing.assert_close(freq, torch.softmax(logits[0].double(), -1), atol=5e-3, rtol=0)


def test_gaussian_draws_are_normals_draws_with_their_log_prob():
    loc, scale = torch.randn(6, 2), torch.rand(6, 2) + 0.1
    torch.manual_seed(5)
    action, log_prob = BehaviourSampler(discrete=False)(loc, scale)
    torch.manual_seed(5)
    dist = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)
    expected = dist.sample()
    torch.testing.assert_close(action, expected)
    torch.testing.assert_close(log_prob, dist.log_prob(expected))


def test_truncated_draws_are_the_truncated_gaussians_draws_with_its_log_prob():
    """V-RACER's acting policy (App. A): the same draws from the same generator state as ``TruncatedGaussian.sample``
    (what ``ProbabilisticActor`` drew before), inside 3 std, and the truncated density's log-probability."""
    loc, scale = torch.randn(6, 3), torch.rand(6, 3) + 0.1
    torch.manual_seed(7)
    action, log_prob = BehaviourSampler(discrete=False, truncation=3.0)(loc, scale)
    torch.manual_seed(7)
    dist = TruncatedGaussian(loc, scale, width=3.0)
    expected = dist.sample()
    assert torch.equal(action, expected) and ((action - loc).abs() <= 3 * scale).all()
    torch.testing.assert_close(log_prob, dist.log_prob(expected), rtol=0, atol=0)
    normal = torch.distributions.Normal(loc, scale).log_prob(action).sum(-1)  # minus d log Z, Z = erf(3 / sqrt 2)
    torch.testing.assert_close(log_prob, normal - 3 * math.log(math.erf(3 / math.sqrt(2))))
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert torch.equal(BehaviourSampler(discrete=False, truncation=3.0)(loc, scale)[0], loc)


@pytest.mark.parametrize("kind", [ExplorationType.DETERMINISTIC, ExplorationType.MODE, ExplorationType.MEAN])
def test_greedy_under_deterministic_exploration(kind):
    logits = torch.randn(4, 3)
    loc, scale = torch.randn(4, 2), torch.ones(4, 2)
    with set_exploration_type(kind):
        action, log_prob = BehaviourSampler(discrete=True)(logits)
        mean, _ = BehaviourSampler(discrete=False)(loc, scale)
    torch.testing.assert_close(action, logits.argmax(-1))
    torch.testing.assert_close(log_prob, logits.log_softmax(-1).max(-1).values)
    torch.testing.assert_close(mean, loc)
    with set_exploration_type(ExplorationType.RANDOM):
        draws = torch.stack([BehaviourSampler(discrete=False)(loc, scale)[0] for _ in range(3)])
    assert not torch.allclose(draws[0], draws[1])  # random again outside the greedy context


class NotPlain(TensorDictModule):
    """A TensorDictModule subclass: TensorCall does not know what its forward adds, so it is called with TensorDicts."""


@pytest.mark.parametrize("plain", [True, False])
def test_a_chain_of_networks_gives_its_tensordict_calls_outputs_from_a_tensordict_or_tensors(plain):
    """Plain modules are called on tensors (TensorCall), any other chain on TensorDicts: the same outputs."""
    torch.manual_seed(0)
    kind = TensorDictModule if plain else NotPlain
    actor = TensorDictSequential(kind(nn.Linear(4, 8), in_keys=["observation"], out_keys=["core"]))
    critic = TensorDictModule(nn.Linear(8, 2), in_keys=["core"], out_keys=[("critic", "q")])
    call = NetworkCall(actor, critic)
    assert (call.tensors is not None) == plain
    assert call.tensors is None or call.tensors.in_keys == ["observation"]
    obs = torch.randn(5, 4)
    expected = critic(actor(TensorDict({"observation": obs, "other": torch.zeros(5)}, batch_size=[5])))
    for inputs in (TensorDict({"observation": obs, "other": torch.zeros(5)}, batch_size=[5]), {"observation": obs}):
        out = call(inputs)
        for key in ("core", ("critic", "q")):
            torch.testing.assert_close(out.get(key), expected.get(key), rtol=0, atol=0)
        assert out.get("other", None) is None  # the inputs the networks read, not the whole TensorDict


def test_a_bounded_gaussian_mean_is_the_centre_plus_half_width_times_tanh_and_stays_inside():
    """``GaussianHead(bounds=(low, high))``: ``loc = (high + low) / 2 + (high - low) / 2 * tanh(W x + b)``, within
    [low, high] however large ``W x + b``; without bounds, ``loc = W x + b`` and the same std."""
    torch.manual_seed(0)
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    bounded = GaussianHead(3, 2, init_std=0.3, learn_std=False, bounds=(low, high))
    free = GaussianHead(3, 2, init_std=0.3, learn_std=False)
    free.load_state_dict({k: v for k, v in bounded.state_dict().items() if k not in ("center", "half_width")})
    x = 100 * torch.randn(64, 3)
    linear = x @ bounded.loc.weight.T + bounded.loc.bias
    (loc, std), (free_loc, free_std) = bounded(x), free(x)
    torch.testing.assert_close(loc, torch.stack([2 * linear[:, 0].tanh(), 0.5 + 0.5 * linear[:, 1].tanh()], -1))
    assert bool(((loc >= low) & (loc <= high)).all()) and (linear.abs() > 10).any()
    torch.testing.assert_close(free_loc, linear)
    torch.testing.assert_close(std, free_std)


def test_the_nature_cnn_starts_orthogonal_with_relus_gain_and_zero_biases():
    """Each layer's weight, flattened to [out, in], has orthonormal rows scaled by sqrt(2) (out <= in everywhere
    here), and its bias is zero."""
    from acer_torchrl.modules import NatureCNN

    torch.manual_seed(0)
    layers = [m for m in NatureCNN(4).modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert len(layers) == 4
    for layer in layers:
        w = layer.weight.detach().flatten(1)
        torch.testing.assert_close(w @ w.T, 2.0 * torch.eye(w.shape[0]), atol=1e-4, rtol=0)
        assert not layer.bias.any()
