"""The engine layer: models, weights, attention, pooling, async results. No networking, no asyncio.

Import what you need from the submodules (`embedserve.engine.engine.Engine`, ...): this package
imports nothing itself, so importing a light submodule does not pull in torch.
"""
