"""backend=nanotron: nanotron's trainer driven stage by stage, with a checkpoint bridge to the
torch model (bridge.py), LIDAS growth as checkpoint surgery (surgery.py), per-stage YAML and the
torchrun command (render.py, checked by schema.py), and the training job (train.py)."""
