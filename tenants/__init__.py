"""Tenant-private state: action modules, adapters, optimizer slots, checkpoints, the policy store.

No Kafka here. One file per job:

* ``config``      frozen dataclasses: TenantConfig (HeadConfig, SuffixConfig, OptimConfig, PPOConfig)
* ``heads``       OFT-style action-chunk regression head; Gaussian actor-critic head for PPO
* ``suffix``      the policy suffix: a transformer block over the backbone's tokens, with peft LoRA
* ``policy``      a tenant's modules as one nn.Module, built from seeds without the global RNG;
                  ``act_each``: rollout actions at one fixed shape
* ``acts``        TickActs: the actions asked of one policy in one event-loop tick, in one ``act_each``
* ``targets``     SFT and PPO targets, and the checks that a batch fits a tenant
* ``losses``      L1 on action chunks; clipped-surrogate PPO
* ``optim``       AdamW, the LR schedule, optimizer state as named tensors
* ``slot``        TenantSlot: modules + optimizer + RNG + counters + health; memory accounting
* ``group_step``  one update per tenant of a group; one tenant's failure never reaches another
* ``policy_store`` versioned checkpoints (safetensors + JSON), atomic, verified on load
* ``errors``      the tenant branch of the error hierarchy
"""
