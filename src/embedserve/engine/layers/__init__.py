"""The building blocks the models share: the linear layer over the ops table, rotary angles, and
the norms' parameters."""
