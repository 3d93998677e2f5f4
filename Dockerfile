# A tuner worker: docker compose up --scale worker=3 (see docker-compose.yml).
# TORCH_INDEX picks the torch build: the CUDA wheels by default on PyPI; for CPU-only hosts use
# --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu
FROM python:3.11-slim
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://pypi.org/simple
WORKDIR /app
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY objectives ./objectives
COPY storage ./storage
RUN pip install --no-cache-dir ".[grpc,mysql]"
RUN useradd --create-home tuner
USER tuner
WORKDIR /home/tuner
ENTRYPOINT ["python", "-m", "tuner.study"]
CMD ["--hardware", "auto", "--n-trials", "20"]
