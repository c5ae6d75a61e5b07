"""Graphs larger than device memory (seed 003, NeuGraph): a computation whose plan needs
more than `make_transformer(..., memory_budget=BYTES)` runs chunk by chunk.

    grid.py     the P x P chunk grid, its pieces and selective scheduling
    plan.py     the computation cut into vertex, edge and small stages
    program.py  the stages compiled and streamed, block by block and piece by piece
"""
from .grid import ChunkGrid, ChunkSlot, RowBlock
from .plan import ChunkingError, Plan
from .program import ChunkedProgram, plan_bytes

__all__ = ["ChunkGrid", "ChunkSlot", "ChunkingError", "ChunkedProgram", "Plan", "RowBlock",
           "plan_bytes"]
