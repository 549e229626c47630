"""Several answers to one request (OpenAI's ``n``): the deployment is asked n times at once, answer i with the
request's seed + i where it gives one, so the same seeded request gives the same n answers again.

The n requests are sent together (from a thread each) so that the engine decodes them side by side; a stream's n
answers are then read in turn, a token of each, while the server keeps generating the others (their tokens wait in
their connections).
"""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Iterator

from deploy.client import Chunk, Completion, GenerateParams

from ..models import Deployment
from .deployments import deployment_generate, deployment_stream

SEEDS = 2**63  # the models' seed is a 64-bit integer: seed + i wraps around within it


def choice_params(params: GenerateParams, n: int) -> list[GenerateParams]:
    """The parameters of each of ``n`` answers."""
    if params.seed is None:
        return [params] * n
    return [replace(params, seed=(params.seed + i) % SEEDS) for i in range(n)]


def _each(deployment: Deployment, asks: list[GenerateParams], ask) -> list:
    """``ask(deployment, params)`` for each of ``asks`` at once; the first failure raised once all have ended, the
    streams that did open closed (their requests cancelled on the server)."""
    deployment.server  # noqa: B018 - fetched here, so that the threads below do not touch the database
    if len(asks) == 1:
        return [ask(deployment, asks[0])]
    with ThreadPoolExecutor(len(asks), thread_name_prefix="choice") as pool:
        futures = [pool.submit(ask, deployment, params) for params in asks]
    failures = [f.exception() for f in futures if f.exception() is not None]
    if failures:
        for answer in (f.result() for f in futures if f.exception() is None):
            if hasattr(answer, "close"):
                answer.close()
        raise failures[0]
    return [f.result() for f in futures]


def generate_choices(deployment: Deployment, asks: list[GenerateParams]) -> list[Completion]:
    """The whole answer to each of ``asks``, asked together; ServingError if any cannot be had."""
    return _each(deployment, asks, deployment_generate)


def stream_choices(deployment: Deployment, asks: list[GenerateParams]) -> Iterator[tuple[int, Chunk]]:
    """(answer's index, chunk) of each of ``asks``, a chunk of each in turn until all have ended. Every stream has
    its first chunk before this returns (ServingError otherwise, as for one stream); closing the iterator early
    cancels the requests still running."""
    return _in_turn(_each(deployment, asks, deployment_stream))


def _in_turn(streams: list[Iterator[Chunk]]) -> Iterator[tuple[int, Chunk]]:
    live = list(enumerate(streams))
    try:
        while live:
            for item in list(live):
                index, stream = item
                chunk = next(stream, None)
                if chunk is None:
                    live.remove(item)
                else:
                    yield index, chunk
    finally:
        for stream in streams:
            stream.close()
