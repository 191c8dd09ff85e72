# kvscope server image.
#
# CPU build (the default):   docker compose build kvscope
# CUDA build:                docker compose --profile gpu build kvscope-gpu
#   or by hand:              docker build --build-arg TORCH_INDEX_URL=https://pypi.org/simple .
# (the default PyPI torch wheel for Linux x86_64 is the CUDA build; the CPU index keeps the
# image about 1.5 GB smaller when no GPU is wanted).
ARG PYTHON_IMAGE=python:3.11-slim
# The wheel is built where a C compiler is (the slim image has none), for the same Python.
ARG BUILD_IMAGE=python:3.11

FROM ${BUILD_IMAGE} AS wheel
# kvscope built as a user builds it: `pip wheel` compiles the core and copies the page
# (templates/ and static/) into the package, so the image serves what `pip install` ships.
COPY . /src
RUN pip wheel --no-cache-dir --no-deps -w /wheels /src

FROM ${PYTHON_IMAGE}

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The root filesystem may be mounted read-only (docker-compose.yml does so): caches that
    # matplotlib and torch would write under $HOME go to the /tmp tmpfs instead.
    MPLCONFIGDIR=/tmp/matplotlib \
    XDG_CACHE_HOME=/tmp/cache

# torch first, in its own layer: it is by far the largest dependency and changes least often.
RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}"

# torch is already satisfied: the wheel adds the light dependencies only.
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/kvscope-*.whl \
 && rm -rf /wheels \
 && useradd --system --uid 10001 --no-create-home --home-dir /tmp kvscope
WORKDIR /tmp

# A fixed numeric UID so that orchestrators can check runAsNonRoot without resolving names.
USER 10001

EXPOSE 8000

# slim images have no curl or wget: probe with the interpreter that is already there.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

# Inside a container the server must bind 0.0.0.0: 127.0.0.1 would be the container's own
# loopback, unreachable through the published port. Exposure is limited on the host side instead
# (docker-compose.yml publishes on 127.0.0.1 only); set KVSCOPE_TOKEN before publishing wider.
CMD ["kvscope", "serve", "--host", "0.0.0.0", "--port", "8000"]
