"""``polychip``: submit and watch training jobs from a terminal or a CI pipeline.

Only click is imported to start (``polychip --help`` answers before any HTTP or terminal library
loads); httpx, rich and PyYAML come in with the commands that use them. Every failure is one line on
stderr and an exit code (``controlplane.cli.exitcodes``), never a traceback.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from controlplane.cli import exitcodes
from controlplane.cli.errors import CliError
from controlplane.cli.output import FORMATS, Column, Out

if TYPE_CHECKING:
    from controlplane.cli.api import Api

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES = """Exit codes: 0 succeeded; 100 the job failed; 101 not finished when the wait's time was up;
102 not found; 103 cancelled; 104 refused (it can never run here); 2 usage error (a bad option, file
or spec); 1 transport or authentication error; 130 interrupted (the job goes on)."""


# --- plumbing -------------------------------------------------------------------------------------


def _target_options(func: F) -> F:
    """--url, --token, -o and --quiet, on every command that talks to the API."""
    func = click.option("-q", "--quiet", is_flag=True, help="No messages on stderr; the output and errors only.")(func)
    func = click.option(
        "-o", "--output", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
        help="What stdout gets: a table for people; json, yaml or name (kind/id) for scripts.",
    )(func)  # fmt: skip
    func = click.option("--token", envvar="POLYCHIP_TOKEN", help="API token [env POLYCHIP_TOKEN; else `login`'s].")(
        func
    )
    func = click.option("--url", envvar="POLYCHIP_URL", help="Server [env POLYCHIP_URL; else `login`'s].")(func)
    return func


class Context:
    def __init__(self, url: str | None, token: str | None, fmt: str, quiet: bool) -> None:
        from controlplane.cli import config

        self.target = config.resolve(url, token)
        self.out = Out(fmt=fmt, quiet=quiet)

    def api(self) -> Api:
        from controlplane.cli.api import Api

        if not self.target.token:
            raise CliError(
                exitcodes.ERROR,
                "no API token: run `polychip login`, set POLYCHIP_TOKEN, or pass --token "
                "(`make demo` makes the demo tenant's, in var/demo-token)",
            )
        return Api(self.target.url, self.target.token)


def api_command(func: Callable[..., int | None]) -> Callable[..., None]:
    """A command with the target options; it gets a ``Context`` first and may return an exit code."""

    @_target_options
    @functools.wraps(func)
    def run(url: str | None, token: str | None, fmt: str, quiet: bool, **kwargs: Any) -> None:
        code = func(Context(url, token, fmt, quiet), **kwargs)
        if code:
            sys.exit(code)

    return run


def _job_id(text: str) -> int:
    """A job as ``12`` or ``job/12`` (what ``-o name`` prints)."""
    number = text.removeprefix("job/")
    if not number.isdigit() or len(number) > 18:
        raise CliError(exitcodes.USAGE, f"{text!r} is not a job id; give its number (12) or its name (job/12)")
    return int(number)


JOB_ID = click.argument("job", metavar="JOB")


def _loss(job: dict[str, Any]) -> Any:
    return (job.get("loss") or {}).get("last")


def _progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    return f"{progress.get('steps_done', 0)}/{progress.get('total_steps', 0)}"


def _devices(job: dict[str, Any]) -> str:
    spec = job.get("spec") or {}
    return f"{spec.get('devices', '?')} x {'|'.join(spec.get('flavors') or [])}"


def _why(job: dict[str, Any]) -> str:
    text = job.get("pending_reason") or job.get("failure_reason") or ""
    return text if len(text) <= 60 else text[:57] + "..."


JOB_COLUMNS = [
    Column("ID", lambda j: j["id"], "right"),
    Column("NAME", lambda j: j["name"]),
    Column("STATE", lambda j: j["state"]),
    Column("DEVICES", _devices),
    Column("STEPS", _progress, "right"),
    Column("LOSS", _loss, "right"),
    Column("WHY", _why),
]


# --- the group ------------------------------------------------------------------------------------


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EXIT_CODES,
)
@click.version_option(package_name="polychip", prog_name="polychip", message="%(prog)s %(version)s")
def cli() -> None:
    """Polychip: train on mixed accelerators. Submit jobs, watch them, get what they made.

    The server and token come from --url/--token, POLYCHIP_URL/POLYCHIP_TOKEN, or `polychip login`.
    """


# --- who ------------------------------------------------------------------------------------------


@cli.command()
@click.option("--url", envvar="POLYCHIP_URL", help="The server, e.g. https://polychip.example.org.")
@click.option("--token", envvar="POLYCHIP_TOKEN", help="An API token (pc_...); read from stdin when absent.")
@click.option("-q", "--quiet", is_flag=True)
def login(url: str | None, token: str | None, quiet: bool) -> None:
    """Check a server and token, and keep them in the config file (mode 0600)."""
    from controlplane.cli import config
    from controlplane.cli.api import Api

    url = (url or config.default_url()).rstrip("/")
    if not token:
        token = click.prompt("API token", hide_input=True, err=True) if sys.stdin.isatty() else sys.stdin.readline()
    token = (token or "").strip()
    if not token:
        raise CliError(exitcodes.USAGE, "no token given: pass --token, set POLYCHIP_TOKEN, or type it when asked")
    with Api(url, token) as api:
        me = api.get("/api/v1/me")
    path = config.save(url, token)
    Out(quiet=quiet).say(f"logged in to {url} as {me['user']} of tenant {me['tenant']['slug']}; kept in {path}")


@cli.command()
def logout() -> None:
    """Forget the stored server and token."""
    from controlplane.cli import config

    gone = config.forget()
    print(f"{'removed' if gone else 'there was no'} {config.config_path()}", file=sys.stderr)


@cli.command()
@api_command
def whoami(ctx: Context) -> None:
    """The tenant, user and scopes the token acts as."""
    with ctx.api() as api:
        me = api.get("/api/v1/me")
    ctx.out.show(
        me,
        kind="user",
        columns=[
            Column("SERVER", lambda _: ctx.target.url),
            Column("TENANT", lambda m: m["tenant"]["slug"]),
            Column("USER", lambda m: m["user"]),
            Column("ROLE", lambda m: m["role"]),
            Column("SCOPES", lambda m: ",".join(m["scopes"])),
            Column("TOKEN", lambda m: (m["token"] or {}).get("name")),
        ],
        rows=[{**me, "id": me["user"]}],
    )


# --- jobs -----------------------------------------------------------------------------------------


def _read_spec(path: str) -> Any:
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except FileNotFoundError:
        raise CliError(exitcodes.USAGE, f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(exitcodes.USAGE, f"cannot read {path}: {exc}") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CliError(exitcodes.USAGE, f"{path} is not valid YAML or JSON{where}: {problem}") from None
    if not isinstance(spec, dict):
        raise CliError(
            exitcodes.USAGE,
            f"{path} holds {type(spec).__name__}, not a job spec (a mapping with name, devices, flavors)",
        )
    return spec


def _run_id() -> str | None:
    """This CI run, as the CI names it: a step retried within it is the same submission."""
    for names in (
        ("POLYCHIP_RUN_ID",),
        ("GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_JOB"),
        ("CI_PIPELINE_ID", "CI_JOB_NAME"),
        ("BUILD_TAG",),  # Jenkins
    ):
        if os.environ.get(names[0]):
            return "/".join(os.environ.get(name, "") for name in names)
    return None


def derive_idempotency_key(spec: Any, given: str | None) -> str:
    """The key a submit carries: the one given; else the spec's and the CI run's (a CI step retried in
    the same run submits once); else one of this invocation's own (its HTTP retries land once)."""
    if given:
        return given
    run = _run_id()
    if run is None:
        return f"cli-{uuid.uuid4()}"
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return "cli-" + hashlib.sha256(f"{run}\n{canonical}".encode()).hexdigest()[:40]


# The advisor's parts, in the order its summary gives them.
ADVICE_PARTS = ("admission", "start", "batch", "checkpoint", "comm", "cost")
ADVICE_COLUMNS = [Column("PART", lambda row: row["name"]), Column("ADVICE", lambda row: row["advice"])]


def _show_advice(ctx: Context, advice: dict[str, Any]) -> None:
    """The advice: a table of each part's headline (every sentence with -o json or yaml)."""
    rows = [{"name": part, "advice": (advice[part]["reasoning"] or ["-"])[0]} for part in ADVICE_PARTS]
    ctx.out.show(advice, kind="advice", columns=ADVICE_COLUMNS, rows=rows)


@cli.command()
@click.argument("spec_file", metavar="SPEC")
@api_command
def advise(ctx: Context, spec_file: str) -> None:
    """Advise on the job spec in SPEC before submitting it: whether and where it would start now, when,
    its micro-batches, checkpoint intervals, gradient compression and cost. Nothing is submitted."""
    spec = _read_spec(spec_file)
    with ctx.api() as api:
        _show_advice(ctx, api.advise(spec))


@cli.command()
@click.argument("spec_file", metavar="SPEC")
@click.option("--dry-run", is_flag=True, help="Check the spec as submit would and print the advice; submit nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the job to end; exit with its outcome.")
@click.option("--follow", is_flag=True, help="Wait, showing its state changes and progress on stderr.")
@click.option("--timeout", type=click.FloatRange(min=0), default=3600, show_default=True, help="Seconds to wait.")
@click.option("--cancel-on-timeout", is_flag=True, help="Cancel the job when the wait's time is up.")
@click.option("--idempotency-key", help="Sent as Idempotency-Key [default: from the spec and the CI run].")
@api_command
def submit(
    ctx: Context,
    spec_file: str,
    dry_run: bool,
    wait_: bool,
    follow: bool,
    timeout: float,
    cancel_on_timeout: bool,
    idempotency_key: str | None,
) -> int:
    """Submit the job spec in SPEC (YAML or JSON; - for stdin)."""
    from controlplane.cli import watch

    spec = _read_spec(spec_file)
    if dry_run:
        with ctx.api() as api:
            _show_advice(ctx, api.advise(spec, dry_run=True))
        ctx.out.say("dry run: nothing submitted")
        return exitcodes.SUCCEEDED
    key = derive_idempotency_key(spec, idempotency_key)
    with ctx.api() as api:
        job = api.submit(spec, idempotency_key=key)
        ctx.out.say(f"submitted job {job['id']} ({job['name']}): {job['state']}")
        if not (wait_ or follow):
            ctx.out.show(job, kind="job", columns=JOB_COLUMNS)
            return exitcodes.SUCCEEDED
        return watch.until_done(api, ctx.out, job["id"], timeout_s=timeout, follow=follow, cancel=cancel_on_timeout)


@cli.command(name="list")
@click.option("--state", help="One state or several, comma-separated (queued,running).")
@click.option("--name", help="Part of the name, any case.")
@click.option("--flavor", help="Asked for, or ran on.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--all", "every", is_flag=True, help="Every job, page after page (no --limit).")
@api_command
def list_jobs(ctx: Context, state: str | None, name: str | None, flavor: str | None, limit: int, every: bool) -> None:
    """Your tenant's jobs, newest first."""
    with ctx.api() as api:
        rows = list(
            api.pages("/api/v1/jobs", "jobs", limit=None if every else limit, state=state, name=name, flavor=flavor)
        )
    ctx.out.show(rows, kind="job", columns=JOB_COLUMNS)


@cli.command()
@JOB_ID
@api_command
def get(ctx: Context, job: str) -> None:
    """One job: its state, devices, progress and loss."""
    with ctx.api() as api:
        found = api.job(_job_id(job))
    ctx.out.show(found, kind="job", columns=JOB_COLUMNS)


@cli.command()
@JOB_ID
@api_command
def events(ctx: Context, job: str) -> None:
    """A job's events, oldest first."""
    with ctx.api() as api:
        rows = list(api.pages(f"/api/v1/jobs/{_job_id(job)}/events", "events", limit=None))
    ctx.out.show(
        rows,
        kind="event",
        columns=[
            Column("AT", lambda e: e["created_at"]),
            Column("KIND", lambda e: e["kind"]),
            Column("STATE", lambda e: f"{e['from_state'] or ''}→{e['to_state']}" if e["to_state"] else ""),
            Column("MESSAGE", lambda e: e["message"]),
        ],
    )


@cli.command()
@JOB_ID
@click.option("--follow", "-f", is_flag=True, help="Keep printing lines as they come, until the run ends.")
@click.option("--rank", type=click.IntRange(min=0), help="One rank's output (default: every rank's).")
@click.option("--attempt", type=click.IntRange(min=0), help="Which run (default: the newest).")
@click.option("--tail", type=click.IntRange(min=1), help="The last N lines only.")
@api_command
def logs(ctx: Context, job: str, follow: bool, rank: int | None, attempt: int | None, tail: int | None) -> int:
    """A job's output, each line prefixed with its rank."""
    params: dict[str, Any] = {"format": "text", "follow": "true" if follow else "false"}
    params |= {k: v for k, v in (("rank", rank), ("attempt", attempt), ("tail", tail)) if v is not None}
    with ctx.api() as api:
        try:
            for chunk in api.stream(f"/api/v1/jobs/{_job_id(job)}/logs", **params):
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            return exitcodes.INTERRUPTED
    return exitcodes.SUCCEEDED


def _act(ctx: Context, job: str, action: str) -> dict[str, Any]:
    """POST a job action once: its own Idempotency-Key makes the client's retries of it land once."""
    with ctx.api() as api:
        result: dict[str, Any] = api.post(
            f"/api/v1/jobs/{_job_id(job)}/{action}", idempotency_key=f"cli-{uuid.uuid4()}"
        )
    return result


@cli.command()
@JOB_ID
@api_command
def cancel(ctx: Context, job: str) -> None:
    """Cancel a job (its processes are stopped and its usage metered)."""
    found = _act(ctx, job, "cancel")
    ctx.out.say(f"job {found['id']} is {found['state']}")
    ctx.out.show(found, kind="job", columns=JOB_COLUMNS)


@cli.command()
@JOB_ID
@click.option("--timeout", type=click.FloatRange(min=0), default=3600, show_default=True, help="Seconds to wait.")
@click.option("--follow", is_flag=True, help="Show state changes and progress on stderr while waiting.")
@click.option("--cancel-on-timeout", is_flag=True, help="Cancel the job when the time is up.")
@api_command
def wait(ctx: Context, job: str, timeout: float, follow: bool, cancel_on_timeout: bool) -> int:
    """Wait for a job to end; exit with its outcome (0, 100 failed, 103 cancelled, 101 not yet)."""
    from controlplane.cli import watch

    with ctx.api() as api:
        return watch.until_done(api, ctx.out, _job_id(job), timeout_s=timeout, follow=follow, cancel=cancel_on_timeout)


@cli.command()
@JOB_ID
@api_command
def retry(ctx: Context, job: str) -> None:
    """Submit an ended job again, as a new job."""
    clone = _act(ctx, job, "retry")
    ctx.out.say(f"submitted job {clone['id']}, a retry of job {_job_id(job)}")
    ctx.out.show(clone, kind="job", columns=JOB_COLUMNS)


@cli.command()
@JOB_ID
@click.argument("priority", type=click.IntRange(-1000, 1000))
@api_command
def priority(ctx: Context, job: str, priority: int) -> None:
    """Move a job that has not ended within your tenant's queue (higher goes first)."""
    with ctx.api() as api:
        found = api.post(f"/api/v1/jobs/{_job_id(job)}/priority", {"priority": priority})
    ctx.out.show(found, kind="job", columns=JOB_COLUMNS)


# --- the tenant's picture -------------------------------------------------------------------------


@cli.command()
@api_command
def queue(ctx: Context) -> None:
    """Your waiting jobs in admission order, each with its place and reason."""
    with ctx.api() as api:
        rows = api.get("/api/v1/queue")["queue"]
    ctx.out.show(
        rows,
        kind="job",
        columns=[
            Column("PLACE", lambda q: q["position"], "right"),
            Column("ID", lambda q: q["job"], "right"),
            Column("NAME", lambda q: q["name"]),
            Column("PRIORITY", lambda q: q["priority"], "right"),
            Column("REASON", lambda q: q["reason"]),
        ],
        rows=[{**q, "id": q["job"]} for q in rows],
    )


@cli.command()
@api_command
def quota(ctx: Context) -> None:
    """Your quotas, what is in use and borrowed, and what your cohort could lend now."""
    with ctx.api() as api:
        rows = api.get("/api/v1/quotas")["quotas"]
    ctx.out.show(
        rows,
        kind="quota",
        columns=[
            Column("RESOURCE", lambda q: q["resource"]),
            Column("IN USE", lambda q: q["in_use"], "right"),
            Column("NOMINAL", lambda q: q["nominal"], "right"),
            Column("BORROWED", lambda q: q["borrowed"], "right"),
            Column("COHORT CAN LEND", lambda q: q["cohort_can_lend"], "right"),
        ],
        rows=[{**q, "id": q["resource"]} for q in rows],
    )


@cli.command()
@api_command
def pool(ctx: Context) -> None:
    """The pool's flavors: devices, healthy, in use."""
    with ctx.api() as api:
        data = api.get("/api/v1/pool")
    ctx.out.show(
        data,
        kind="flavor",
        columns=[
            Column("FLAVOR", lambda f: f["flavor"]),
            Column("VENDOR", lambda f: f["vendor"]),
            Column("DEVICES", lambda f: f["devices"]["total"], "right"),
            Column("HEALTHY", lambda f: f["devices"]["healthy"], "right"),
            Column("IN USE", lambda f: f["devices"]["allocated"], "right"),
            Column("BF16 TFLOPS", lambda f: f["peak_bf16_tflops"], "right"),
        ],
        rows=[{**f, "id": f["flavor"]} for f in data["flavors"]],
    )


@cli.command()
@click.option("--period", help="A month, YYYY-MM (default: every period).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@api_command
def usage(ctx: Context, period: str | None, limit: int) -> None:
    """Your metered usage: ledger entries, in the order they were posted."""
    with ctx.api() as api:
        rows = list(api.pages("/api/v1/usage", "entries", limit=limit, period=period))
    ctx.out.show(
        rows,
        kind="usage",
        columns=[
            Column("JOB", lambda e: e["job_id"], "right"),
            Column("FLAVOR", lambda e: e["flavor"]),
            Column("DEVICE", lambda e: e["device_id"]),
            Column("STARTED", lambda e: e["started_at"]),
            Column("SECONDS", lambda e: e["duration_ms"] / 1000, "right"),
            Column("NAU·MS", lambda e: e["nau_milli"], "right"),
        ],
        rows=[{**e, "id": e["key"]} for e in rows],
    )


@cli.command()
@api_command
def invoices(ctx: Context) -> None:
    """Your invoices, newest first."""
    with ctx.api() as api:
        rows = list(api.pages("/api/v1/invoices", "invoices", limit=None))
    ctx.out.show(
        rows,
        kind="invoice",
        columns=[
            Column("NUMBER", lambda i: i["number"]),
            Column("PERIOD", lambda i: i["period"]),
            Column("STATUS", lambda i: i["status"]),
            Column("TOTAL", lambda i: f"{i['total']} {i.get('currency', '')}".strip(), "right"),
        ],
    )


@cli.command()
@api_command
def tokens(ctx: Context) -> None:
    """Your tenant's API tokens (never their secrets; needs the manage scope)."""
    with ctx.api() as api:
        rows = list(api.pages("/api/v1/tokens", "tokens", limit=None))
    ctx.out.show(
        rows,
        kind="token",
        columns=[
            Column("ID", lambda t: t["id"], "right"),
            Column("NAME", lambda t: t["name"]),
            Column("PREFIX", lambda t: t["prefix"]),
            Column("SCOPES", lambda t: ",".join(t["scopes"])),
            Column("USER", lambda t: t["user"]),
            Column("EXPIRES", lambda t: t["expires_at"]),
            Column("REVOKED", lambda t: t["revoked_at"]),
        ],
    )


# --- this program ---------------------------------------------------------------------------------


@cli.command()
def version() -> None:
    """This CLI's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        print(installed("polychip"))
    except PackageNotFoundError:
        print("unknown (not installed)")


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script: eval "$(polychip completion bash)"."""
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    if completer is None:  # pragma: no cover (the three choices all have one)
        raise CliError(exitcodes.USAGE, f"no completion for {shell}")
    print(completer(cli, {}, "polychip", "_POLYCHIP_COMPLETE").source())


# --- running the control plane here (the full install) --------------------------------------------


def _server() -> Any:
    try:
        from controlplane.cli import server
    except ImportError as exc:
        raise CliError(
            exitcodes.USAGE,
            f"running the control plane needs the server install ({exc.name} is missing): "
            "pip install 'polychip[server]'",
        ) from None
    return server


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, envvar="POLYCHIP_PORT", default=8000, show_default=True)
def up(host: str, port: int) -> None:
    """Start the ASGI server, a Celery worker and beat on this machine (the embedded default)."""
    _server().up(host=host, port=port)


@cli.command()
def down() -> None:
    """Stop what `up` or `demo` started, and the jobs' processes."""
    _server().down()


@cli.command()
def status() -> None:
    """Which of the servers run here."""
    _server().status()


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, envvar="POLYCHIP_PORT", default=8000, show_default=True)
@click.option("--stop", is_flag=True, help="Stop the servers after the summary (for CI).")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds to wait for the job.")
@click.option("--no-job", is_flag=True, help="Start and create the demo accounts; submit nothing.")
def demo(host: str, port: int, stop: bool, timeout: float, no_job: bool) -> None:
    """Start here, create the demo tenant and operator, run the demo job and summarize it."""
    code = _server().demo(host=host, port=port, stop=stop, timeout_s=timeout, no_job=no_job)
    if code:
        sys.exit(code)


# --- the entry point ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="polychip", standalone_mode=False)
    except CliError as error:
        print(f"polychip: {error.message}", file=sys.stderr)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        print("polychip: interrupted", file=sys.stderr)
        sys.exit(exitcodes.INTERRUPTED)
    except click.ClickException as error:
        error.show()
        sys.exit(exitcodes.USAGE if isinstance(error, click.UsageError) else exitcodes.ERROR)
    except KeyboardInterrupt:
        print("polychip: interrupted", file=sys.stderr)
        sys.exit(exitcodes.INTERRUPTED)
    except BrokenPipeError:
        sys.exit(exitcodes.SUCCEEDED)  # `polychip list | head`: the reader had enough
