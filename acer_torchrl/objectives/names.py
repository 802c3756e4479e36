"""Names the losses share with the rest of the package: the entries they read besides their
``_AcceptedKeys`` (written by the acting policy and by the replay) and the values of their string options.
No torch here: the torch-free settings (``--help``) read the option values too."""

BEHAVIOUR = "behaviour"  # root key of the behaviour statistics mu written at acting time
MASK_KEY = "mask"  # False on padding steps past the end of a sampled sequence's episode
SLOT_KEY = "slot"  # storage slot of every sampled step (where write-backs go)
WRITE_KEY = "write_index"  # which write put a sampled single step in its slot (the replay's w-th step ever: slot w mod capacity)

PG_ESTIMATORS = ("beta_loo", "tislr")  # ReactorLoss(pg=...): beta-LOO (eq. 5) or TISLR (sec. 2.2)
