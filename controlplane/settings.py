"""Settings, read from the environment.

Embedded default (nothing set): SQLite, a filesystem Celery broker shared by processes on this
host, the in-memory channel layer and the local backend. Production sets DATABASE_URL,
CELERY_BROKER_URL, CHANNEL_REDIS_URL and POLYCHIP_BACKEND. The code never branches on which.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import dj_database_url
import django_stubs_ext

from controlplane import logs
from controlplane.body_limit import UPLOAD_FRAMING_BYTES

# Django's generic classes take type arguments at runtime as they do for the type checker:
# ``class InvoiceAdmin(admin.ModelAdmin[Invoice])`` (django-stubs' documented way).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("POLYCHIP_VAR_DIR", BASE_DIR / "var")).resolve()


def keep_var_private(var_dir: Path) -> None:
    """What the control plane writes is its own: files 0600 and folders 0700 from here on (the
    database, the secret key, the broker's messages, every job's files), and var/ itself can be
    passed through (a sandboxed rank reaches its own run by exact name, see
    ``runtime.backends.local.sandbox``) but not listed. An older install's files are tightened too."""
    os.umask(0o077)
    var_dir.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(var_dir, 0o711)  # noqa: S103 (traversal only, no listing)
        for name in ("polychip.sqlite3", "polychip.sqlite3-wal", "polychip.sqlite3-shm", "secret-key"):
            if (var_dir / name).exists():
                os.chmod(var_dir / name, 0o600)
    except PermissionError:  # a var/ folder owned by someone else: theirs to keep
        pass


keep_var_private(VAR_DIR)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_optional_float(name: str) -> float | str | None:
    """A number from the environment, None when unset or empty. A value that is not a number is kept
    as written, so that a system check (jobs/checks.py) names it and the fix, instead of a traceback."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return value


def _local_secret_key(path: Path) -> str:
    """A random key made once per var/ folder and kept there (mode 0600), shared by every process
    of this installation; production sets DJANGO_SECRET_KEY instead. Never a key known in advance:
    it signs sessions and derives the workers' ingest tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another process may be writing it this instant
            if key := path.read_text().strip():
                return key
            time.sleep(0.02)
        raise
    key = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or _local_secret_key(VAR_DIR / "secret-key")
DEBUG = env_bool("DJANGO_DEBUG", False)


def said_production(environ: Mapping[str, str]) -> bool:
    return environ.get("POLYCHIP_ENV", "").strip().lower() == "production"


def production_like(environ: Mapping[str, str], debug: bool) -> bool:
    """Said outright (POLYCHIP_ENV=production), or implied by a real database with debugging off."""
    return said_production(environ) or (not debug and bool(environ.get("DATABASE_URL", "").strip()))


# A production-like start refuses to run while a demo account exists (controlplane/production.py).
PRODUCTION_LIKE = production_like(os.environ, DEBUG)
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")

# --- HTTPS ------------------------------------------------------------------------------------
# The production profile (POLYCHIP_ENV=production) serves over HTTPS only: redirect, HSTS for a year,
# cookies sent over HTTPS only. Each setting can be changed from the environment; behind a proxy that
# ends TLS, POLYCHIP_BEHIND_TLS_PROXY=1 trusts its X-Forwarded-Proto. `manage.py check --deploy` is
# clean under this profile (tests/security/test_deploy_settings.py runs it).
HTTPS_PROFILE = said_production(os.environ)
SECURE_SSL_REDIRECT = env_bool("POLYCHIP_SECURE_SSL_REDIRECT", HTTPS_PROFILE)
SECURE_HSTS_SECONDS = int(os.environ.get("POLYCHIP_HSTS_SECONDS", "31536000" if HTTPS_PROFILE else "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("POLYCHIP_HSTS_INCLUDE_SUBDOMAINS", HTTPS_PROFILE)
# The preload directive lets the domain be submitted to browsers' preload lists; nothing submits it.
SECURE_HSTS_PRELOAD = env_bool("POLYCHIP_HSTS_PRELOAD", HTTPS_PROFILE)
SESSION_COOKIE_SECURE = env_bool("POLYCHIP_SECURE_COOKIES", HTTPS_PROFILE)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
if env_bool("POLYCHIP_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Public origins of a proxy in front of Polychip (https://polychip.example.com), for CSRF and the
# WebSocket's origin check.
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("POLYCHIP_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from here, not from a CDN
    "channels",
    "axes",
    "controlplane",
    "tenants",
    "billing",
    "jobs",
    "frontend",
]

MIDDLEWARE = [
    # First: every line logged for a request carries its id, Django's own answer line included.
    "controlplane.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "controlplane.middleware.RejectUnfitQueryStrings",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication: a key belongs to the token or the signed-in user that sent it.
    "controlplane.idempotency.IdempotencyKeyMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into a 429.
    "axes.middleware.AxesMiddleware",
]

# --- Sign-in lockout (django-axes, controlplane/auth.py) ------------------------------------
AUTHENTICATION_BACKENDS = ["controlplane.auth.LockoutBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = int(os.environ.get("POLYCHIP_LOGIN_FAILURE_LIMIT", "10"))
# Per account and per address, each on its own: guessing one password from many addresses, or many
# accounts' from one, both stop at the limit.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("POLYCHIP_LOGIN_COOLOFF_MINUTES", "15")))
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

# --- Content-Security-Policy (django-csp) on every page ------------------------------------
# Scripts, styles, images and connections (the WebSocket included) only from this origin; no
# framing; no plugins. Inline style attributes stay allowed (the quota and budget bars set their
# widths with them); inline scripts do not.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'polychip.sqlite3'}",
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (ASGI server, Celery worker, beat) share the file: wait for locks
    # instead of failing at once, and take the write lock at BEGIN so that claims serialize.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
elif os.environ.get("POLYCHIP_DB_POOL") == "1":
    # The ASGI server runs each request's synchronous part in a thread of its own, so a connection
    # kept per thread (CONN_MAX_AGE) dies with its request: without a pool every request pays a
    # PostgreSQL connection (a fork on the server, about a third of a short request's time). The
    # server process turns this on (controlplane/asgi.py); Celery's forked workers keep their own
    # per-process connections, since a pool's threads do not survive a fork.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "pool": {"min_size": 2, "max_size": int(os.environ.get("POLYCHIP_DB_POOL_SIZE", "8")), "timeout": 20}
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if hashers := os.environ.get("POLYCHIP_PASSWORD_HASHERS"):
    # The test tiers set a fast hasher: PBKDF2's deliberate slowness costs seconds per fixture.
    PASSWORD_HASHERS = hashers.split(",")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns about a missing root
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON that Python or PostgreSQL cannot take (deep nesting, NUL, lone surrogates) is a 400.
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "controlplane.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "controlplane.openapi.AutoSchema",
    # 429 with Retry-After past these rates (controlplane/throttles.py); the ingest route has its own.
    "DEFAULT_THROTTLE_CLASSES": [
        "controlplane.throttles.PerTokenThrottle",
        "controlplane.throttles.PerAddressThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "token": os.environ.get("POLYCHIP_RATE_PER_TOKEN", "1200/min"),
        "address": os.environ.get("POLYCHIP_RATE_PER_ADDRESS", "3000/min"),
        "ingest": os.environ.get("POLYCHIP_RATE_INGEST_PER_JOB", "30000/min"),
    },
    "UNAUTHENTICATED_USER": None,
}

# The OpenAPI schema of /api/v1 (controlplane/openapi.py; committed as controlplane/openapi.yaml, checked
# by `make lint`), with Swagger UI at /api/v1/docs and Redoc at /api/v1/redoc from vendored assets.
SPECTACULAR_SETTINGS = {
    "TITLE": "Polychip API",
    "DESCRIPTION": (
        "The control plane of a private cloud of mixed accelerators: jobs, bundles, logs, metrics, checkpoints, "
        "quotas, usage and invoices. Authenticate with a tenant API token: `Authorization: Bearer pc_...`. "
        'Every error answers `{"error": {"code", "message", "field"?, "errors"?}}`.'
    ),
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",  # JSON Schema 2020-12: the job spec's own schema (runtime.jobspec) fits as it is
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "SORT_OPERATIONS": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {},
}

# --- Celery -------------------------------------------------------------------------------
# The embedded broker is kombu's filesystem transport: a folder of message files that every
# process on this host can read, so the worker and beat are real separate processes.
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = (
    {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {"visibility_timeout": 3600}
)
if CELERY_BROKER_URL.startswith("filesystem"):
    CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"  # kombu's, with atomic writes
    for folder in ("queue", "control", "processed"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# A worker process runs one task at a time: it keeps its database connection from task to task, for
# up to this many seconds (controlplane/celery.py), rather than opening one per task. A new
# PostgreSQL connection forks a backend whose first queries run on cold catalog caches: 20-30 ms,
# against the 10 ms of a one-job admission cycle (bench/admission.py). 0: one connection per task.
POLYCHIP_WORKER_DB_CONN_MAX_AGE = int(os.environ.get("POLYCHIP_WORKER_DB_CONN_MAX_AGE", "600"))
# Celery's Django fixup closes the connections around every task unless this is set; it then closes
# them every this many tasks, and the age and health checks above decide the rest.
CELERY_DB_REUSE_MAX = 1000 if POLYCHIP_WORKER_DB_CONN_MAX_AGE else None
POLYCHIP_SWEEP_SECONDS = float(os.environ.get("POLYCHIP_SWEEP_SECONDS", "1.0"))
# A sweep that could not run within its period is superseded by the next one: expire it rather
# than let them pile up while both worker slots are busy launching or tearing down.
_SWEEP = {"schedule": POLYCHIP_SWEEP_SECONDS, "options": {"expires": POLYCHIP_SWEEP_SECONDS * 2}}
# The usage outbox is posted to the ledger every few seconds; budgets are checked twice a minute
# (admission also checks a tenant's hard budget before it admits anything of it).
POLYCHIP_RELAY_SECONDS = float(os.environ.get("POLYCHIP_RELAY_SECONDS", "5"))
# Every this many seconds the elastic round chooses each running elastic job's device count again
# (jobs.resizing): a resize is made only when it gains more over the round than the measured move
# costs. 0 turns it off (elastic jobs then keep the count they started on, growing back after a loss).
POLYCHIP_ELASTIC_ROUND_S = float(os.environ.get("POLYCHIP_ELASTIC_ROUND_S", "300"))
CELERY_BEAT_SCHEDULE = {
    "admit-queued-jobs": {"task": "jobs.tasks.admit_queued_jobs", **_SWEEP},
    "observe-running-jobs": {"task": "jobs.tasks.observe_running_jobs", **_SWEEP},
    "relay-usage": {
        "task": "billing.tasks.relay_usage",
        "schedule": POLYCHIP_RELAY_SECONDS,
        "options": {"expires": POLYCHIP_RELAY_SECONDS * 2},
    },
    "check-budgets": {"task": "billing.tasks.check_budgets", "schedule": 30.0, "options": {"expires": 60.0}},
    "sync-cluster-inventory": {
        "task": "jobs.tasks.sync_cluster_inventory",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
    **(
        {
            "elastic-round": {
                "task": "jobs.tasks.elastic_round",
                "schedule": POLYCHIP_ELASTIC_ROUND_S,
                "options": {"expires": POLYCHIP_ELASTIC_ROUND_S},
            }
        }
        if POLYCHIP_ELASTIC_ROUND_S > 0
        else {}
    ),
    "invoice-cycle": {"task": "billing.tasks.invoice_cycle", "schedule": 3600.0, "options": {"expires": 3600.0}},
    "purge-idempotency-keys": {
        "task": "tenants.tasks.purge_idempotency_keys",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
}
# How long an Idempotency-Key's answer is kept (the IETF draft and Stripe keep at least 24 h).
POLYCHIP_IDEMPOTENCY_TTL_HOURS = int(os.environ.get("POLYCHIP_IDEMPOTENCY_TTL_HOURS", "24"))
# Last month's invoices are finalized from this day of the month on (usage of last month that arrives
# later, up to 35 days after it ended, goes on the next invoice as an adjustment line).
POLYCHIP_INVOICE_FINALIZE_DAY = int(os.environ.get("POLYCHIP_INVOICE_FINALIZE_DAY", "3"))

# --- Channels -----------------------------------------------------------------------------
CHANNEL_REDIS_URL = os.environ.get("CHANNEL_REDIS_URL", "")
# The cache holds the API's throttle counts: per process on the embedded default, shared through
# Redis when POLYCHIP_CACHE_URL names one (several server processes then count together).
CACHE_URL = os.environ.get("POLYCHIP_CACHE_URL", "")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}
        if CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
# Requests for admission coalesce through that cache when every process shares it: a sender that finds
# a request still waiting for a worker sends none, since the worker that takes it decides after both
# commits (jobs.dispatch). A per-process cache cannot tell a server that a worker took one.
POLYCHIP_COALESCE_ADMISSION_REQUESTS = bool(CACHE_URL)
CHANNEL_LAYERS = {
    "default": (
        {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [CHANNEL_REDIS_URL]}}
        if CHANNEL_REDIS_URL
        else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    )
}

# --- Polychip -----------------------------------------------------------------------------
# The most jobs one tenant may have waiting at once, unless an operator sets the tenant's own
# (max_queued_jobs); a submission past it is refused (409 queue_full) and changes nothing.
POLYCHIP_MAX_QUEUED_JOBS = int(os.environ.get("POLYCHIP_MAX_QUEUED_JOBS", "1000"))
# An admission cycle weighs at most this many of each tenant's waiting jobs (by priority, then age):
# its cost grows with what can be admitted, not with the length of one tenant's queue.
POLYCHIP_ADMISSION_WINDOW_PER_TENANT = int(os.environ.get("POLYCHIP_ADMISSION_WINDOW_PER_TENANT", "64"))
# Tenants' training code (POST /api/v1/bundles, checked by runtime.bundles): stored content-addressed in
# one folder per tenant here, each tar.gz at most this large.
POLYCHIP_BUNDLES_DIR = Path(os.environ.get("POLYCHIP_BUNDLES_DIR", VAR_DIR / "bundles"))
POLYCHIP_BUNDLE_MAX_BYTES = int(os.environ.get("POLYCHIP_BUNDLE_MAX_BYTES", str(64 * 1024 * 1024)))
# The largest request body any route takes (413 beyond it, before Django buffers it: body_limit.py),
# and larger limits for routes that take uploads: the bundle upload's (the bundle and a form's framing
# around it); "path-prefix=bytes,..." in POLYCHIP_UPLOAD_LIMITS adds routes or overrides these.
POLYCHIP_MAX_REQUEST_BYTES = int(os.environ.get("POLYCHIP_MAX_REQUEST_BYTES", str(4 * 1024 * 1024)))
POLYCHIP_UPLOAD_LIMITS = {
    "/api/v1/bundles": POLYCHIP_BUNDLE_MAX_BYTES + UPLOAD_FRAMING_BYTES,
    **{
        prefix.strip(): int(size)
        for prefix, _, size in (
            item.partition("=") for item in os.environ.get("POLYCHIP_UPLOAD_LIMITS", "").split(",") if "=" in item
        )
    },
}
POLYCHIP_BACKEND = os.environ.get("POLYCHIP_BACKEND", "local")
# The local backend runs tenants' python and torchrun code as a user of its own job: auto (where this host
# can switch users, i.e. as root), required (refuse such jobs where it cannot), off.
POLYCHIP_SANDBOX = os.environ.get("POLYCHIP_SANDBOX", "auto")
# The Kubernetes backend (issue 21, being built; jobs.checks names a bad value): the cluster (a kubeconfig
# file, or empty for the in-cluster service account), the image built-in jobs' ranks run, and the
# namespaces: one per tenant under the prefix, the control plane's own. Per-flavor extended resources,
# node labels and tolerations are in the pool file's kubernetes sections.
POLYCHIP_K8S_KUBECONFIG = os.environ.get("POLYCHIP_K8S_KUBECONFIG", "")
POLYCHIP_K8S_WORKER_IMAGE = os.environ.get("POLYCHIP_K8S_WORKER_IMAGE", "")
POLYCHIP_K8S_NAMESPACE_PREFIX = os.environ.get("POLYCHIP_K8S_NAMESPACE_PREFIX", "polychip-t-")
POLYCHIP_K8S_CONTROL_PLANE_NAMESPACE = os.environ.get("POLYCHIP_K8S_CONTROL_PLANE_NAMESPACE", "polychip")
# Where the ranks send telemetry from inside the cluster: the web Service, which the tenants'
# NetworkPolicy admits (not the public address behind the Ingress).
POLYCHIP_K8S_TELEMETRY_URL = os.environ.get(
    "POLYCHIP_K8S_TELEMETRY_URL", f"http://polychip-web.{POLYCHIP_K8S_CONTROL_PLANE_NAMESPACE}.svc"
)
POLYCHIP_POOL_FILE = os.environ.get("POLYCHIP_POOL_FILE", str(BASE_DIR / "runtime" / "pools" / "demo.yaml"))
POLYCHIP_RUNS_DIR = Path(os.environ.get("POLYCHIP_RUNS_DIR", VAR_DIR / "runs"))
POLYCHIP_ARTIFACTS_DIR = Path(os.environ.get("POLYCHIP_ARTIFACTS_DIR", VAR_DIR / "artifacts"))
# Where workers send heartbeats and step telemetry: the control plane's own address.
POLYCHIP_PUBLIC_URL = os.environ.get("POLYCHIP_PUBLIC_URL", "http://127.0.0.1:8000")
# A running job whose workers sent nothing for this long is recovered (jobs.recovery). Workers send a
# heartbeat every second; the local backend's supervisor also watches each rank's heartbeat itself
# and reports a silent rank within seconds, so this is the last resort (a whole host gone).
POLYCHIP_HEARTBEAT_TIMEOUT_S = float(os.environ.get("POLYCHIP_HEARTBEAT_TIMEOUT_S", "20"))
# Until an attempt's first telemetry its ranks are starting (importing torch, rendezvous), which on a
# loaded host takes minutes: they get this long before the silence counts.
POLYCHIP_STARTUP_GRACE_S = float(os.environ.get("POLYCHIP_STARTUP_GRACE_S", "300"))
# What moving a job to more devices costs (checkpoint, stop, restart, restore), until restarts of its
# class have measured it: a shrunk or elastic job grows only when the faster steps repay it.
POLYCHIP_MOVE_COST_S = float(os.environ.get("POLYCHIP_MOVE_COST_S", "30"))
# Where jobs' checkpoints go, one folder (or prefix) per job: a directory (file:///...) or an
# S3-compatible bucket, s3://bucket/prefix[?endpoint=http://host:port] (pip install polychip[s3]).
POLYCHIP_CHECKPOINT_URL = os.environ.get("POLYCHIP_CHECKPOINT_URL", f"file://{VAR_DIR / 'checkpoints'}")
# The interval advisor's failure rate until the pool has run 100 device-hours of its own history:
# about one failure a day per thousand devices, as large clusters report.
# The trained device failure predictor (manage.py train_failure_predictor writes it); until it exists
# devices are not scored.
POLYCHIP_FAILURE_PREDICTOR = Path(os.environ.get("POLYCHIP_FAILURE_PREDICTOR", VAR_DIR / "failure-predictor.pt"))
POLYCHIP_DEVICE_FAILURES_PER_HOUR = float(os.environ.get("POLYCHIP_DEVICE_FAILURES_PER_HOUR", "0.00004"))
# The local backend also keeps every telemetry event of each rank in its run folder (for benchmarks
# and tests that read what a killed run did last; off by default: the files grow with the steps).
POLYCHIP_LOCAL_TELEMETRY_FILES = os.environ.get("POLYCHIP_LOCAL_TELEMETRY_FILES", "") in ("1", "true", "yes")
# Warm rank processes (torch imported, waiting for a rank) that the local backend keeps on this host, so
# that a restarted job's ranks skip the interpreter's start and torch's imports; 0 keeps none. A claimed
# one is replaced by a fork of the warm pool in milliseconds, so two serve a job of any size.
POLYCHIP_LOCAL_STANDBY_RANKS = int(os.environ.get("POLYCHIP_LOCAL_STANDBY_RANKS", "2"))
# The local backend pads each emulated step to samples * this / relative_speed milliseconds.
POLYCHIP_LOCAL_SAMPLE_TIME_MS = float(os.environ.get("POLYCHIP_LOCAL_SAMPLE_TIME_MS", "0.5"))
# The local backend slows the link between a job's vendor groups to this many Gbit/s, so that what
# gradient compression saves shows on one host (loopback is too fast for it to pay); unset: no
# throttling. Shaping: netns (tc in network namespaces; needs root), token_bucket (the ranks' own
# transport waits) or auto (netns where the machine allows it, else the token bucket).
POLYCHIP_LOCAL_LINK_GBIT = env_optional_float("POLYCHIP_LOCAL_LINK_GBIT")
POLYCHIP_LOCAL_LINK_SHAPING = os.environ.get("POLYCHIP_LOCAL_LINK_SHAPING", "auto").strip()
# Quotas in NAU count throughput in units of one device of this flavor (the slowest flavor when
# the pool lacks it).
POLYCHIP_NAU_REFERENCE = os.environ.get("POLYCHIP_NAU_REFERENCE", "a100-sxm")
# Fair sharing weighs current usage and decayed past usage half and half (the blend); past usage
# halves every half-life, so last week's burst hardly counts today.
POLYCHIP_FAIR_SHARE_HALF_LIFE_H = float(os.environ.get("POLYCHIP_FAIR_SHARE_HALF_LIFE_H", "12"))
POLYCHIP_FAIR_SHARE_BLEND = float(os.environ.get("POLYCHIP_FAIR_SHARE_BLEND", "0.5"))
# The placement policy admission follows when it chooses a job's flavors (runtime.scheduling.policies):
# aware (default), mixed, fair, max_throughput, fifo; "none" tries each job's flavors in its own order.
POLYCHIP_PLACEMENT_POLICY = os.environ.get("POLYCHIP_PLACEMENT_POLICY", "aware")
# How often the portal's event relay looks for new job events to push.
POLYCHIP_PUSH_POLL_S = float(os.environ.get("POLYCHIP_PUSH_POLL_S", "0.05"))

# JSON lines from every process, with the request, tenant, job and attempt bound (controlplane/logs.py);
# POLYCHIP_LOG_FORMAT=text for a terminal. Celery leaves the root logger to these settings.
POLYCHIP_LOG_LEVEL = os.environ.get("POLYCHIP_LOG_LEVEL", "INFO").upper()
POLYCHIP_LOG_FORMAT = os.environ.get("POLYCHIP_LOG_FORMAT", "json")
LOGGING = logs.logging_config(POLYCHIP_LOG_LEVEL, POLYCHIP_LOG_FORMAT)
logs.configure_structlog()
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# /metrics answers operators' sessions, and scrapers that send this token as "Authorization: Bearer ...";
# empty (the default): operators only.
POLYCHIP_METRICS_TOKEN = os.environ.get("POLYCHIP_METRICS_TOKEN", "")
