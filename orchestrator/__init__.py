"""Distributed experiment orchestrator: Hydra grid -> Ray jobs -> results store -> report."""
