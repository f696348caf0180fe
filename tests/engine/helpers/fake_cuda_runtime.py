"""The CUDA runtime's host-registration calls, stood in for, so pinned memory's order of calls is seen on a CPU."""


class FakeRuntime:
    """Stands in for the CUDA runtime: records calls in order, can refuse registrations."""

    def __init__(self, log: list, refuse: bool = False):
        self.log, self.refuse = log, refuse

    def host_register(self, pointer: int, num_bytes: int) -> int:
        self.log.append("register")
        return 2 if self.refuse else 0  # 2 = cudaErrorMemoryAllocation

    def host_unregister(self, pointer: int) -> int:
        self.log.append("unregister")
        return 0

    def error_string(self, code: int) -> str:
        return "out of memory"

    def clear_last_error(self) -> None:
        self.log.append("clear")
