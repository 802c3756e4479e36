"""Estimates an agent keeps per stored step of the replay, beside its loss: V-RACER's stored ``V``, ``rho`` and
``V(s_{k+1})`` and the targets run over them (:class:`~acer_torchrl.estimates.vracer.VRACEREstimates`). They read
the replay through what it offers (:class:`~acer_torchrl.replay.EpisodeStore`) and hand the loss its batch."""
