"""The GEMVs' spinning pool (``engine/native/split_pool.h``) on its own: every unit of a range run exactly once, a
status passed back, and no data race under ThreadSanitizer, through the spin path, the sleep path, more threads than
cores and calls that take fewer workers than an earlier one started."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine.native import library as native

HEADER = Path(native.__file__).with_name("split_pool.h")

DRIVER = r"""
#include "split_pool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct { int *hits; long fail_at; } job;

static int mark(const void *context, long lo, long hi) {
    const job *j = context;
    for (long i = lo; i < hi; i++) __atomic_fetch_add(&j->hits[i], 1, __ATOMIC_RELAXED);
    return (j->fail_at >= lo && j->fail_at < hi) ? 7 : 0;
}

/* A call whose first task (the caller's: it takes task 0 before it waits) holds on until another thread has run a
 * task, for up to 60 s: the other tasks can then only go to a worker, so "the workers take tasks" is shown on a
 * loaded machine too, where a caller may otherwise finish every task of many calls before the OS runs a worker. */
static int other_ran;
static int rendezvous(const void *context, long lo, long hi) {
    (void)context; (void)hi;
    if (lo != 0) { __atomic_store_n(&other_ran, 1, __ATOMIC_RELEASE); return 0; }
    for (long waited = 0; !__atomic_load_n(&other_ran, __ATOMIC_ACQUIRE); waited++) {
        if (waited > 60000) return 9;
        usleep(1000);
    }
    return 0;
}

static int workers_join(void) {
    __atomic_store_n(&other_ran, 0, __ATOMIC_RELEASE);
    return sp_run(rendezvous, NULL, 4, 1, 2);
}

/* After a fork from a process whose pool has workers: the child's splits still cover every unit, and its own new
 * workers take tasks (the parent's do not exist there). */
static int forked(void) {
    static int hits[2000];
    job j = {hits, -1};
    sp_run(mark, &j, 2000, 1, 2); /* the parent's pool started */
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        const long before = sp_worker_tasks();
        for (int call = 0; call < 200; call++) {
            memset(hits, 0, sizeof hits);
            if (sp_run(mark, &j, 2000, 1, 2) != 0) _exit(2);
            for (int i = 0; i < 2000; i++) if (hits[i] != 1) _exit(3);
        }
        if (workers_join() != 0) _exit(5);
        _exit(sp_worker_tasks() > before ? 0 : 4);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 99);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "fork") == 0) return forked();
    static int hits[4099];
    const long spins[] = {0, 20000, 2000000};
    const int threads[] = {2, 8, 3, 1, 5};
    for (int s = 0; s < 3; s++) {
        sp_set_spin_ns(spins[s]);
        for (int call = 0; call < 300; call++) {
            const long total = 1 + (call * 37) % 4099, align = 1 + call % 4;
            const long fail_at = call % 5 == 0 ? (call * 13) % total : -1;
            for (long i = 0; i < total; i++) hits[i] = 0;
            job j = {hits, fail_at};
            const int status = sp_run(mark, &j, total, align, threads[call % 5]);
            for (long i = 0; i < total; i++)
                if (hits[i] != 1) { printf("unit %ld of %ld run %d times\n", i, total, hits[i]); return 1; }
            if (status != (fail_at >= 0 ? 7 : 0)) { printf("status %d, fail_at %ld\n", status, fail_at); return 1; }
        }
    }
    const long before = sp_worker_tasks();
    if (workers_join() != 0) { printf("no worker joined a call\n"); return 1; }
    printf("worker tasks %ld\n", sp_worker_tasks() - before);
    return 0;
}
"""


def _run(tmp_path: Path, flags: list[str], *args: str) -> subprocess.CompletedProcess:
    compiler = native.compiler()
    source = tmp_path / "driver.c"
    source.write_text(DRIVER)
    binary = tmp_path / "driver"
    built = subprocess.run([compiler, "-O1", "-g", "-pthread", f"-I{HEADER.parent}", *flags, "-o", str(binary),
                            str(source)], capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        pytest.skip(f"cannot build the driver with {flags}: {built.stderr[-300:]}")
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300)


needs_compiler = pytest.mark.skipif(native.compiler() is None or shutil.which(native.compiler()) is None,
                                    reason="no C compiler here")


@needs_compiler
def test_every_unit_runs_once_and_a_failing_range_reports_its_status(tmp_path):
    done = _run(tmp_path, [])
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(done.stdout.split()[-1]) > 0  # the workers took tasks of the rendezvous call, not the caller alone


@needs_compiler
def test_no_data_race_under_threadsanitizer(tmp_path):
    done = _run(tmp_path, ["-fsanitize=thread"])
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stdout + done.stderr


@needs_compiler
def test_a_forked_child_starts_its_own_workers(tmp_path):
    done = _run(tmp_path, [], "fork")
    assert done.returncode == 0, done.stdout + done.stderr
