"""The isolated arms of one run or `check` (`Isolation`): a user module's arms registered without
importing the module here, built-in arms given workers of their own, every worker but the timed
arm's frozen while it is timed, and every worker ended at the close (trial/remote.py: one arm's
worker as the gate and the timed rounds call it)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType

from kerneltrial.ops import registry
from kerneltrial.ops.registry import Impl, RegistryError, Unavailable
from kerneltrial.trial import timed
from kerneltrial.trial.isolation import ArmRaised, ArmSource, Settings, WorkerFailure, WorkerHandle
from kerneltrial.trial.remote import IsolatedArm, Remote, RemoteFn


def is_isolated(impl: Impl) -> bool:
    return impl.available and isinstance(impl.resolve(), RemoteFn)


@dataclass
class Isolation:
    """The isolated arms of one run or `check`, each with a worker of its own; `close` ends them."""

    settings: Settings
    remotes: list[Remote] = field(default_factory=list)

    def __enter__(self) -> Isolation:
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def module_arms(self, spec: str, op: str | None = None) -> list[Impl]:
        """Register the `user:` arms of a user module (a .py path or a dotted name) without importing
        it here: a worker imports it and says which operators it defines. With `op`, a module that
        defines no function `op` is refused, as `registry.load_user_module` refuses it."""
        path = Path(spec)
        if spec.endswith(".py") and not path.is_file():
            raise RegistryError(f"user module {spec!r} does not exist; pass a .py file or a dotted module name")
        module = str(path.resolve()) if spec.endswith(".py") or path.exists() else spec
        ops = registry.all_ops()
        remote = self.remote(ArmSource("sealed", module=module), [o.name for o in ops])
        try:
            remote.start()
        except (ArmRaised, WorkerFailure) as exc:
            raise RegistryError(
                f"user module {spec} failed to import in an isolated worker: {type(exc).__name__}: {exc}"
            ) from None
        added = []
        for operator in ops:
            if operator.name in remote.handle.defines:
                name = f"user:{registry.user_stem(spec)}"
                operator.impls[name] = Impl(
                    op=operator.name,
                    name=name,
                    kind="user",
                    loader=lambda o=operator: RemoteFn(remote, o.name, bool(o.inplace)),
                    doc=f"{operator.name} from {spec}, in an isolated worker",
                )
                added.append(operator.impls[name])
        if op is not None and not any(a.op == op for a in added):
            raise registry.no_function_named(spec, op, remote.handle.functions)
        if not added:
            raise registry.no_operator_function(spec)
        return added

    def isolate(self, impl: Impl) -> Impl:
        """`impl` run in a worker of its own (a built-in arm, from kerneltrial's operators there);
        an isolated arm as it is. Calibration copies run in the harness's process."""
        if impl.kind == "calibration":
            raise ValueError(f"calibration arm {impl.name!r} cannot be isolated; isolate its base arm")
        if isinstance(impl.resolve(), RemoteFn):
            return impl
        remote = self.remote(ArmSource("registry", op=impl.op), [impl.name])

        def loader() -> RemoteFn:
            local = impl.resolve()
            if local is None:
                raise Unavailable(impl.reason)
            return RemoteFn(remote, impl.name, bool(registry.get_op(impl.op).inplace), local)

        return replace(impl, loader=loader, _fn=None, _reason=None)  # the same contract (layouts, widths)

    def quiet(self, arm: timed.TimedArm | None) -> None:
        """Freeze every worker but `arm`'s (trial/confine.py): while one arm is timed, no other arm's
        process runs an instruction, so none can slow it. An in-process arm (None, or not isolated)
        freezes them all. A frozen worker thaws at its next request."""
        keep = arm.remote if isinstance(arm, IsolatedArm) else None
        for remote in self.remotes:
            process = remote.handle.process
            if process is not None and remote is not keep:
                process.confinement.freeze()

    def remote(self, source: ArmSource, names: list[str]) -> Remote:
        remote = Remote(WorkerHandle(source, self.settings, names))
        self.remotes.append(remote)
        return remote

    def close_builtin(self) -> None:
        """End the workers of built-in arms (`isolate`), keep those of user modules."""
        for remote in [r for r in self.remotes if r.handle.source.mode == "registry"]:
            remote.handle.close()
            self.remotes.remove(remote)

    def close(self) -> None:
        for remote in self.remotes:
            remote.handle.close()
        self.remotes.clear()
