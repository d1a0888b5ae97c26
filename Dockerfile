# gymflow worker image: one image for every pool (`gymflow worker --pool workflows|env|generate`).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# bubblewrap: the env pool's sandbox for tool and test code. tini: PID 1 that forwards SIGTERM to
# the worker (which then finishes in-flight activities) and reaps sandbox processes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap libseccomp2 tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/gymflow

# Dependencies first, in their own layer: a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p gymflow workflows activities environments workers \
 && for p in gymflow workflows activities environments workers; do touch "$p/__init__.py"; done \
 && pip install . \
 && pip uninstall -y gymflow \
 && rm -rf gymflow workflows activities environments workers

COPY gymflow ./gymflow
COPY workflows ./workflows
COPY activities ./activities
COPY environments ./environments
COPY workers ./workers
RUN pip install --no-deps . \
 && gymflow --help >/dev/null

RUN useradd --create-home --uid 10001 gymflow
USER gymflow
WORKDIR /home/gymflow

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["gymflow", "worker", "--pool", "all"]
