"""Deploying checkpoints on Triton servers, undeploying them, and generating with what is deployed.

A deployment is checked and saved here (pending), then a worker does the work (workers.deploying): export the
checkpoint into the server's model repository, load it, compare the served model's greedy tokens with the
checkpoint's own, ready. Generation goes to Triton through deploy.client (webapp.services.triton turns its failures
into ServingError): only a ready deployment answers.
"""
import re
from typing import Iterator

from django.core.exceptions import ValidationError
from django.db import transaction

from deploy.client import Chunk, Completion, GenerateParams
from deploy.vllm import rules as vllm_rules
from trainer.contract import ModelSpec, SpecError

from ..models import Checkpoint, Deployment, PromptTemplate, TritonServer, data_roots_for
from .conversions import is_server_import
from .tasks import TaskName, enqueue
from .triton import ServingError, ServingRejected, ServingUnavailable, client_for, triton_errors

MAX_TENSOR_PARALLEL = MAX_INSTANCES = 64
PROTOCOLS = ("http", "grpc")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _model_spec(checkpoint: Checkpoint) -> ModelSpec:
    try:
        return ModelSpec.from_dict(checkpoint.manifest.get("model") or {})
    except (SpecError, TypeError, AttributeError) as exc:
        raise ValidationError({"checkpoint": [f"checkpoint {checkpoint.pk} has no valid model in its manifest "
                                              f"({exc}): register the checkpoint folder again"]}) from None


def tensor_parallel_problem(spec: ModelSpec, tensor_parallel: int) -> str:
    """Why the model cannot be split over ``tensor_parallel`` ranks, or '' (deploy.reshard splits heads and the
    MLP evenly)."""
    if not 1 <= tensor_parallel <= MAX_TENSOR_PARALLEL:
        return f"tensor_parallel={tensor_parallel}: give 1 to {MAX_TENSOR_PARALLEL}"
    if spec.n_heads % tensor_parallel or spec.kv_heads % tensor_parallel or spec.ffn % tensor_parallel:
        return (f"tensor_parallel={tensor_parallel} must divide the model's n_heads={spec.n_heads}, "
                f"kv_heads={spec.kv_heads} and MLP width {spec.ffn}")
    return ""


def engine_problems(spec: ModelSpec, engine: str, server: TritonServer, reduction: str = Deployment.Reduction.NONE,
                    tensor_parallel: int = 1) -> list[str]:
    """Why ``engine`` cannot serve ``spec`` as asked on ``server``; [] when it can. The workbench engine serves
    every model the trainer builds; vLLM's refusals are the export's own (deploy.vllm.rules), so a deployment is
    refused here rather than by the worker after a wait."""
    if engine != Deployment.Engine.VLLM:
        return []
    # a managed server runs on this machine: vLLM's CPU ranks are given this machine's cores
    cores = vllm_rules.usable_cpu_cores() if server.kind == TritonServer.Kind.MANAGED else None
    return vllm_rules.problems(spec, reduction, tensor_parallel, server.instance_kind, cpu_cores=cores)


def model_engines(spec: ModelSpec) -> list[dict[str, str]]:
    """What will serve a model once it is trained, said before it is: each engine on a CPU and on a GPU server, in
    full precision on one rank, with why it cannot where it cannot (the deploy page's own rules)."""
    found = []
    for kind in TritonServer.InstanceKind.values:
        server = TritonServer(instance_kind=kind, kind=TritonServer.Kind.EXTERNAL)
        found += [{"engine": label, "kind": kind.upper(), "refused": "; ".join(engine_problems(spec, engine, server))}
                  for engine, label in Deployment.Engine.choices]
    return found


def checkpoint_engines(checkpoint: Checkpoint, server: TritonServer | None) -> dict[str, str]:
    """Each engine → why it cannot serve ``checkpoint`` on ``server`` (a CPU server where none is chosen) in full
    precision on one rank, '' where it can (what the deploy page offers)."""
    try:
        spec = _model_spec(checkpoint)
    except ValidationError as exc:
        return {engine: exc.message_dict["checkpoint"][0] for engine in Deployment.Engine.values}
    server = server or TritonServer(instance_kind=TritonServer.InstanceKind.CPU, kind=TritonServer.Kind.EXTERNAL)
    return {engine: "; ".join(engine_problems(spec, engine, server)) for engine in Deployment.Engine.values}


def deployment_access_problem(deployment: Deployment) -> str:
    """Why the deployment's owner may not export its checkpoint (any more), or '' (checked when the deployment is
    made and again by the worker before it exports: sharing can be withdrawn, a folder can change in between)."""
    checkpoint, owner = deployment.checkpoint, deployment.owner
    if not checkpoint.is_visible_to(owner):
        return f"checkpoint {checkpoint.pk} is not one you may see: deploy a checkpoint of your own runs"
    if checkpoint.run_id is None and not is_server_import(checkpoint):  # a registered folder: under data roots
        problem = data_roots_for(owner).problem(checkpoint.path)
        if problem:
            return f"checkpoint {checkpoint.pk}: {problem}"
    return ""


@transaction.atomic
def deployment_create(*, owner, checkpoint: Checkpoint, server: TritonServer, model_name: str,
                      reduction: str = Deployment.Reduction.NONE, tensor_parallel: int = 1, instances: int = 1,
                      streaming: bool = True, prompt_template: PromptTemplate | None = None,
                      shared: bool = False, engine: str = Deployment.Engine.WORKBENCH) -> Deployment:
    """Check and save a pending deployment; a worker deploys it once this transaction commits."""
    errors: dict[str, list[str]] = {}
    if not _MODEL_NAME.match(model_name or "") or len(model_name) > 100:
        errors["model_name"] = [f"{model_name!r}: use 1 to 100 letters, digits, '-' and '_' (Triton's model name)"]
    elif Deployment.objects.filter(server=server, model_name=model_name, status__in=Deployment.HOLDING).exists():
        errors["model_name"] = [f"{server.name} already serves a model named {model_name!r}: choose another name, "
                                f"or undeploy that one first"]
    if reduction not in Deployment.Reduction.values:
        errors["reduction"] = [f"{reduction!r}: choose one of {', '.join(Deployment.Reduction.values)}"]
    if engine not in Deployment.Engine.values:
        errors["engine"] = [f"{engine!r}: choose one of {', '.join(Deployment.Engine.values)}"]
    if not 1 <= instances <= MAX_INSTANCES:
        errors["instances"] = [f"instances={instances}: give 1 to {MAX_INSTANCES}"]
    if prompt_template is not None and not prompt_template.is_visible_to(owner):
        errors["prompt_template"] = [f"prompt template {prompt_template.pk} is not one you may see"]
    deployment = Deployment(owner=owner, checkpoint=checkpoint, server=server, model_name=model_name,
                            reduction=reduction, tensor_parallel=tensor_parallel, instances=instances,
                            streaming=streaming, prompt_template=prompt_template, shared=shared, engine=engine)
    problem = deployment_access_problem(deployment)
    if problem:
        errors["checkpoint"] = [problem]
    else:
        spec = _model_spec(checkpoint)
        problem = tensor_parallel_problem(spec, tensor_parallel)
        if problem:
            errors["tensor_parallel"] = [problem]
        if "engine" not in errors and "reduction" not in errors:
            refused = engine_problems(spec, engine, server, reduction, tensor_parallel)
            if refused:
                errors["engine"] = [f"the {engine} engine cannot serve checkpoint {checkpoint.pk}: "
                                    f"{'; '.join(refused)}"]
    if errors:
        raise ValidationError(errors)
    deployment.status_message = f"waiting for a worker to export it to {server.name}"
    deployment.save()
    enqueue(TaskName.DEPLOYMENT_DEPLOY, deployment.pk)
    return deployment


def deployment_undeploy(deployment: Deployment) -> Deployment:
    """Ask a worker to unload the model from its server (the deployment becomes unloaded once it has)."""
    enqueue(TaskName.DEPLOYMENT_UNDEPLOY, deployment.pk)
    return deployment


def _ready(deployment: Deployment) -> None:
    if deployment.status != Deployment.Status.READY:
        why = f": {deployment.status_message}" if deployment.status_message else ""
        then = {Deployment.Status.FAILED: "deploy the checkpoint again",
                Deployment.Status.UNLOADED: "deploy the checkpoint again"}.get(deployment.status,
                                                                                 "wait until it is ready")
        raise ServingUnavailable(f"deployment {deployment.pk} ({deployment.model_name}) is {deployment.status}"
                                 f"{why}; {then}")


def _protocol(server: TritonServer, protocol: str | None) -> str:
    """The protocol asked for, else HTTP. A stream too: Triton's generate_stream costs this process half the CPU a
    token of a gRPC stream (tritonclient starts a stream's own threads and channel per request), which is what
    decides the web app's throughput at many streams."""
    if protocol is None:
        return "http"
    if protocol not in PROTOCOLS:
        raise ServingRejected(f"protocol {protocol!r}: choose http or grpc")
    if protocol == "grpc" and not server.grpc_url:
        raise ServingRejected(f"the Triton server {server.name!r} has no gRPC URL: use protocol http")
    return protocol


def deployment_generate(deployment: Deployment, params: GenerateParams, protocol: str | None = None) -> Completion:
    """The whole answer of a ready deployment; ServingError when it cannot be had."""
    _ready(deployment)
    server = deployment.server
    protocol = _protocol(server, protocol)
    with client_for(server) as client, triton_errors(server, deployment.model_name):
        return client.generate(deployment.model_name, params, protocol=protocol)


def deployment_stream(deployment: Deployment, params: GenerateParams,
                      protocol: str | None = None) -> Iterator[Chunk]:
    """The answer chunk by chunk. The first chunk is awaited here, so that a server that cannot answer is a
    ServingError before anything is sent; a failure later is a ServingError raised by the iterator. Closing the
    iterator early cancels the request on the server."""
    _ready(deployment)
    server = deployment.server
    protocol = _protocol(server, protocol)
    client = client_for(server)
    try:
        with triton_errors(server, deployment.model_name):
            chunks = client.stream(deployment.model_name, params, protocol=protocol)
            first = next(chunks, None)
    except BaseException:
        client.close()
        raise
    if first is None:
        client.close()
        raise ServingError(f"the Triton server {server.name!r} ended the stream without an answer")
    return _rest(server, deployment.model_name, client, chunks, first)


def _rest(server, model: str, client, chunks: Iterator[Chunk], first: Chunk) -> Iterator[Chunk]:
    try:
        chunk = first
        while True:
            yield chunk
            if chunk.finish_reason:
                return
            with triton_errors(server, model):
                chunk = next(chunks, None)
            if chunk is None:
                return
    finally:
        chunks.close()  # early: cancels the request on the server
        client.close()
