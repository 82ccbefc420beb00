#!/usr/bin/env bash
# The processors' HTTP token and TLS material for docker-compose.yml, in deploy/secrets/ (never
# committed: .gitignore): a random token, a CA, and one certificate for processor-0,
# processor-1, localhost and 127.0.0.1 signed by it. `make deploy-secrets`; an existing token
# and certificate are kept (run `rm -r deploy/secrets` first to renew them).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p -m 700 secrets  # private on the host
cd secrets
[ -s http-token ] || { openssl rand -hex 32 > http-token; chmod 644 http-token; }
if [ ! -s processor.pem ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj /CN=rewardstream-ca \
    -keyout ca.key -out ca.pem 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=rewardstream \
    -keyout processor.key -out processor.csr 2>/dev/null
  printf 'subjectAltName=DNS:processor-0,DNS:processor-1,DNS:localhost,IP:127.0.0.1\n' > san.ext
  openssl x509 -req -in processor.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile san.ext -out processor.pem 2>/dev/null
  rm -f processor.csr san.ext ca.srl
  # compose bind-mounts secrets as they are, and the containers run as user 65534
  chmod 644 processor.key
fi
echo "deploy/secrets: http-token, ca.pem, processor.pem, processor.key"
