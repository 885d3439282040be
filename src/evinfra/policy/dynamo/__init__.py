"""Dynamo 1.x modelled as a bundle of evinfra policies: KV router, conditional
disaggregation, SLA and load planners, KVBM host tier, and agent hints (`dynamo-agentic`).

Importing `evinfra.policy.dynamo.bundles` registers the `dynamo` and `dynamo-agentic`
systems; docs/dynamo-baseline.md maps every behaviour to its Dynamo source.
"""
