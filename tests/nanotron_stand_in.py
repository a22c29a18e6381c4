"""A CPU stand-in for nanotron's run_train.py, for tests of the nanotron job's stage loop.

Run by torchrun like the real one (`--config-file <yaml>`): it reads the rendered YAML, resumes
from `resume_checkpoint_path` through latest.txt as nanotron does, refuses a checkpoint whose
depth differs from the config's, "trains" (each step adds 1e-3 to every weight), prints
nanotron-style iteration lines and saves checkpoints in nanotron's layout (jobs/nanotron/bridge).
STAND_IN_FAIL_AFTER=<step> makes it exit 1 right after saving that step (a crashed stage).
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import yaml

from jobs.model import Decoder, ModelConfig
from jobs.nanotron import bridge


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-file", required=True)
    doc = yaml.safe_load(Path(parser.parse_args().config_file).read_text())
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert os.environ["LOCAL_WORLD_SIZE"] == "1"  # the tests run one process
    assert os.environ.get("WANDB_RUN_GROUP", "") == "", "tracker=none: no W&B variables"
    mc, ck, total = doc["model"]["model_config"], doc["checkpoints"], doc["tokens"]["train_steps"]
    model_cfg = ModelConfig(name="stand-in", d_model=mc["hidden_size"], n_layers=mc["num_hidden_layers"],
                            n_heads=mc["num_attention_heads"], n_kv_heads=mc["num_key_value_heads"],
                            d_ff=mc["intermediate_size"], vocab_size=mc["vocab_size"],
                            max_seq_len=mc["max_position_embeddings"], rope_theta=mc["rope_theta"],
                            norm_eps=mc["rms_norm_eps"], init_std=0.02, block_size=1,
                            tie_embeddings=mc["tie_word_embeddings"])
    step = 0
    if ck["resume_checkpoint_path"]:
        root = Path(ck["resume_checkpoint_path"])
        step = int((root / "latest.txt").read_text())
        tensors = bridge.read_tensors(root / str(step) / "model")
        depth = sum(name.endswith("input_layernorm.weight") for name in tensors)
        if depth != mc["num_hidden_layers"]:
            print(f"ValueError: checkpoint has {depth} layers, config {mc['num_hidden_layers']}", flush=True)
            return 1
    else:
        torch.manual_seed(doc["general"]["seed"])
        tensors = bridge.to_nanotron(Decoder(model_cfg, mc["num_hidden_layers"], list(range(mc["num_hidden_layers"]))))
    fail_after = int(os.environ.get("STAND_IN_FAIL_AFTER", -1))
    rank0 = int(os.environ.get("RANK", 0)) == 0
    while step < total:
        step += 1
        tensors = {k: v + 1e-3 for k, v in tensors.items()}
        if rank0:
            print(f"iteration: {step} / {total} | consumed_tokens: 1.2K | lm_loss: {10 / step:.3g} | lr: 0.003",
                  flush=True)
        if rank0 and (step % ck["checkpoint_interval"] == 0 or step == total):
            meta = bridge.training_metadata(step, step * 4, doc["tokens"]["sequence_length"])
            bridge.write_step(Path(ck["checkpoints_path"]), step, tensors, model_cfg, mc, meta)
            if step == fail_after:
                print("RuntimeError: stand-in crash after saving", flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
