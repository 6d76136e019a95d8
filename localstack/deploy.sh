#!/usr/bin/env bash
# Deploy the CDK stack (stage "local") to a running LocalStack with cdklocal, then print the e2e URL.
#   docker compose -f localstack/docker-compose.yml up -d && ./localstack/deploy.sh
#   QUERATOR_E2E_URL=<printed url> uv run --frozen pytest -m e2e tests/e2e
# Idempotent: run it again after a change; bootstrap and deploy only apply what differs. Stage
# "local" gives its functions one asset that holds the layer's contents (bundleLayer in cdk.json):
# LocalStack Community accepts layers but does not mount them.
set -euo pipefail
cd "$(dirname "$0")/.."
# A LocalStack listening elsewhere than localhost:4566 (the deploy test runs one on a free port):
#   QUERATOR_LOCALSTACK_URL=http://127.0.0.1:4599 ./localstack/deploy.sh
url="${QUERATOR_LOCALSTACK_URL:-}"
set -a
# shellcheck source=localstack/localstack.env
. localstack/localstack.env
if [ -n "$url" ]; then
    # Every endpoint there, S3's too: path-style requests need no subdomains that resolve.
    AWS_ENDPOINT_URL="$url" AWS_ENDPOINT_URL_S3="$url" AWS_ENDPOINT_URL_DYNAMODB="$url"
    EDGE_PORT="${url##*:}"
fi
set +a

# LocalStack runs functions in containers of the host's architecture; build the layer to match.
case "$(uname -m)" in
    aarch64 | arm64) arch=arm64 ;;
    *) arch=x86_64 ;;
esac
# Its own layer folder, so the default arm64 layer (layers/core/dist) of the other stages stays.
context=(-c stage=local -c "architecture=${arch}" -c "layerAssetPath=layers/core/dist-local-${arch}")

curl -fsS "${AWS_ENDPOINT_URL}/_localstack/health" >/dev/null || {
    echo "LocalStack is not answering on ${AWS_ENDPOINT_URL}: docker compose -f localstack/docker-compose.yml up -d" >&2
    exit 1
}
[ -x node_modules/.bin/cdklocal ] || npm ci --no-audit --no-fund --loglevel=error
# The app builds the layer for the stage itself (infra/app.py; a no-op while the sources are unchanged).
mkdir -p cdk.out
# LocalStack's one account, named, from a folder without cdk.json: the CLI then does not synthesize
# the app to find the environment (14 s instead of 59 s on a loaded 2-core machine).
(cd localstack && ../node_modules/.bin/cdklocal bootstrap "aws://000000000000/${AWS_DEFAULT_REGION}")
npx cdklocal deploy "${context[@]}" --require-approval never --outputs-file cdk.out/localstack-outputs.json
uv run --frozen python - <<'PY'
import json
outputs = json.load(open("cdk.out/localstack-outputs.json"))["querator-local"]
print(f"QUERATOR_E2E_URL={outputs['ApiUrl']}")
print(f"items table: {outputs['ItemsTableName']}, catalog table: {outputs['CatalogTableName']}")
PY
