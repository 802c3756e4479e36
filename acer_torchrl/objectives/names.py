"""Names the losses share with the rest of the package: the entries they read besides their
``_AcceptedKeys`` (written by the acting policy and by the replay) and the values of their string options.
No torch here: the torch-free settings (``--help``) read the option values too."""

BEHAVIOUR = "behaviour"  # root key of the behaviour statistics mu written at acting time
MASK_KEY = "mask"  # False on padding steps past the end of a sampled sequence's episode
SLOT_KEY = "slot"  # storage slot of every sampled step (where write-backs go)
WRITE_KEY = "write_index"  # which write put a sampled single step in its slot (the replay's w-th step ever: slot w mod capacity)
PRIORITY_WEIGHT_KEY = "priority_weight"  # a prioritized replay's importance weight of each sampled window (per step)
PRIORITY_KEY = "priority"  # a loss's per-window mean |TD error|: the window's new priority, not a metrics column

PG_ESTIMATORS = ("beta_loo", "tislr")  # ReactorLoss(pg=...): beta-LOO (eq. 5) or TISLR (sec. 2.2)


def policy_keys(discrete: bool) -> list[str]:
    """Names of the distribution statistics phi (ACER sec. 3.3): logits, or loc and scale."""
    return ["logits"] if discrete else ["loc", "scale"]


# What an update reports, one name per quantity and one quantity per name: the entries of the four losses' outputs
# (each loss's ``out_keys``), those its stored estimates add after the update (``VRACEREstimates.out_keys``) and the
# trainer's gradient norm; the columns of metrics.csv. The loss terms are TorchRL's A2C names (their sum is the
# objective); every diagnostic is a mean over the batch's real steps unless said otherwise.
OUTPUTS = {
    # loss terms
    "loss_objective": "the policy-gradient term (ACER eq. 9-12, Reactor eq. 5 or TISLR, LASER's V-trace PG, "
                      "V-RACER's off-PG eq. 5)",
    "loss_critic": "the value regression (Q on Q^ret, V on the V-trace target or on V^tbc)",
    "loss_entropy": "-entropy_coeff x entropy (Reactor: x the mean action gap as well)",
    "loss_kl": "V-RACER: ReF-ER's penalty (1 - beta) D_KL(mu || pi) (Rule 2, eq. 10-11)",
    "loss_behaviour": "Reactor with the learned mu-hat: its cross-entropy on the replayed actions (sec. 3.5)",
    # diagnostics every loss can have
    "entropy": "the policy's entropy H(pi(.|s))",
    "rho": "the importance weight pi(a|s) / mu(a|s) (V-RACER: per step in the output, written back)",
    "rho_clipped_share": "share of steps whose rho exceeds its truncation (ACER's c, LASER's rho_bar)",
    "state_value": "V(s) of the learning network (V-RACER: per step in the output, written back)",
    "q_ret": "the Retrace target Q^ret (ACER eq. 5, Reactor eq. 7)",
    "value_target": "LASER: the V-trace target v_s (IMPALA eq. 1)",
    # ACER
    "kl_average": "ACER: D_KL(average policy || pi) of the trust region (eq. 12)",
    "trust_region_active": "ACER: share of steps where the trust-region projection changed the gradient",
    "critic_weight": "ACER with acer.critic_coeff_end: the critic loss's weight at this update (falls over "
                     "acer.critic_decay)",
    # Reactor
    "q_taken": "Reactor: Q(s_t, a_t) of the learning network",
    "action_gap": "Reactor: the mean action gap max_a Q - Q(a') scaling its entropy bonus (sec. 3.5)",
    "trace": "Reactor: the Retrace trace c_t = lambda min(1, rho_t) (eq. 2)",
    "beta": "Reactor: the policy gradient's weight beta (beta-LOO, eq. 5; TISLR: the truncated rho)",
    "mu_hat_log_error": "Reactor with the learned mu-hat: |log mu-hat(a|s) - log mu(a|s)| against the stored mu",
    "support_edge_mass": "Reactor's distributional critic: the target q*'s mass on the support's first and last atoms "
                         "(returns beyond [v_min, v_max] are projected there, sec. 3.2)",
    # LASER
    "beta_kl": "LASER: beta_KL(s) = KL(pi || pi~_mu), the relevance measure (sec. 4.3)",
    "rejected_share": "LASER: share of steps left out by the trust region (beta_KL >= kl_threshold, sec. 4.1)",
    "time_limit_share": "LASER: share of steps where the episode was truncated by a time limit",
    # per window, for a prioritized replay (left out of the update's statistics)
    "priority": "each window's mean |TD error| over its real steps (ACER, Reactor: |Q^ret - Q|, Reactor's distributional "
                "critic: the total variation between q* and q; LASER: |v_s - V|), "
                "its new priority in a prioritized replay (Reactor ICLR sec. 3.3); a [B] tensor, not a metrics column",
    # V-RACER and its stored estimates
    "kl": "V-RACER: D_KL(mu || pi) (Rule 2, eq. 10)",
    "far_batch": "V-RACER: share of the batch's steps that are far-policy (Rule 1, rho outside [1/c_max, c_max])",
    "far_fraction": "V-RACER: ReF-ER's far-policy share over the replay (eq. 12)",
    "refer_beta": "V-RACER: ReF-ER's coefficient beta (eq. 12)",
    "c_max": "V-RACER: ReF-ER's far-policy cut-off c_max (annealed, eq. 13)",
    "policy_std": "V-RACER: the policy's standard deviation (env units, mean over action dimensions)",
    "next_state_value": "V-RACER: V(s_{k+1}) written back to the stored estimates (per step in the output)",
    "reward_scale": "V-RACER: the reward scale sigma_r the update's targets used (App. B, eq. 16)",
    # the trainer's
    "grad_norm": "the gradient's global norm before clipping",
    "priority_weight_mean": "a prioritized replay: the mean importance weight of the update's windows (Reactor ICLR "
                            "sec. 3.3; 1 with uniform draws)",
    "priority_weight_min": "a prioritized replay: the smallest importance weight among the update's windows",
}
