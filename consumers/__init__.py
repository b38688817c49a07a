"""The roles: consumer-group services, one per file or folder, on the bus plumbing in ``bus/``.

``master/`` jobs in, plans out; ``env/`` simulator sessions; ``inference`` grouped forwards to
actions (``acts``: one policy's rows of a group act together); ``rollout`` episodes to PPO
minibatches; ``backbone_train`` gradient jobs to features;
``optimizer`` features to policy versions; ``evaluator`` scores; ``convert`` events <-> tensors;
``service`` what a role process shares; ``bus/`` the loops, DLQ, replay and episode reader.
"""
