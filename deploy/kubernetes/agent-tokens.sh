#!/usr/bin/env bash
# Makes the Secret ringtrain-agent-tokens: one agent token per Kubernetes node that runs an agent (GPU nodes,
# and nodes labelled ringtrain.dev/cpu-worker=true), keyed by node name, as the agents' DaemonSets expect.
# A node that already has a token in the Secret keeps it (a token belongs to the node it first registered);
# run it again after adding nodes. Needs kubectl, curl and python3, and a platform admin token.
#
#   RINGTRAIN_SERVER=https://ringtrain.example:8443 RINGTRAIN_TOKEN=rt_... [RINGTRAIN_CA_CERT=ca.pem] \
#     deploy/kubernetes/agent-tokens.sh [NAMESPACE]
set -euo pipefail
namespace="${1:-ringtrain}"
: "${RINGTRAIN_SERVER:?set RINGTRAIN_SERVER to the server's URL}"
: "${RINGTRAIN_TOKEN:?set RINGTRAIN_TOKEN to a platform admin token}"
curl_ca=()
if [ -n "${RINGTRAIN_CA_CERT:-}" ]; then curl_ca=(--cacert "$RINGTRAIN_CA_CERT"); fi

existing="$(kubectl -n "$namespace" get secret ringtrain-agent-tokens -o json 2>/dev/null || echo '{"data": {}}')"
nodes="$( (kubectl get nodes -l nvidia.com/gpu.present=true -o name; kubectl get nodes -l ringtrain.dev/cpu-worker=true -o name) \
  | sed 's#^node/##' | sort -u)"
args=()
for node in $nodes; do
  token="$(printf '%s' "$existing" | python3 -c 'import base64, json, sys; d = json.load(sys.stdin).get("data") or {}; v = d.get(sys.argv[1]); print(base64.b64decode(v).decode() if v else "")' "$node")"
  if [ -z "$token" ]; then
    echo "agent-tokens.sh: a new agent token for node $node" >&2
    token="$(curl -fsS "${curl_ca[@]}" -X POST "$RINGTRAIN_SERVER/v1/agent-tokens" \
      -H "Authorization: Bearer $RINGTRAIN_TOKEN" -H 'Content-Type: application/json' \
      -d "{\"label\": \"k8s node $node\"}" | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')"
  fi
  args+=("--from-literal=$node=$token")
done
if [ "${#args[@]}" -eq 0 ]; then
  echo "agent-tokens.sh: no node has nvidia.com/gpu.present=true or ringtrain.dev/cpu-worker=true" >&2
  exit 1
fi
kubectl -n "$namespace" create secret generic ringtrain-agent-tokens "${args[@]}" --dry-run=client -o yaml \
  | kubectl apply -f -
