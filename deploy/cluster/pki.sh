# shellcheck shell=bash disable=SC2154 # PKI, STATE_DIR, APISERVER_PORT, ...: set by up.sh
# The local cluster's certificates and kubeconfigs. Sourced by up.sh (not run
# on its own): it uses up.sh's variables (PKI, STATE_DIR, APISERVER_PORT,
# SERVICE_IP, ADMIN_KUBECONFIG) and log. node.sh uses issue, client_ext and
# write_kubeconfig for the kubelet's.

# write_kubeconfig FILE USER CERT KEY: a kubeconfig with embedded credentials,
# so it stays valid if copied elsewhere.
write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: carve
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 <"$3")
    client-key-data: $(base64 -w0 <"$4")
contexts:
- name: carve
  context:
    cluster: carve
    user: $2
current-context: carve
EOF
  chmod 600 "$1"
}

# make_ca NAME CN: a self-signed EC P-256 CA. EC keys because they generate in
# milliseconds; Go's TLS accepts them.
make_ca() {
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$1.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/$1.crt" 2>/dev/null
}

# issue CA NAME SUBJECT EXTENSIONS: an EC P-256 key and a certificate for it
# signed by CA (a make_ca name).
issue() {
  local ca=$1 name=$2 subj=$3 ext=$4
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  printf '%s\n' "$ext" >"$PKI/$name.ext"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -CAserial "$PKI/$ca.srl" -days 365 -sha256 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# Extensions for the certificates issue makes; client_ext is node.sh's too.
server_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
client_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

# cluster_pki: every certificate and kubeconfig of the control plane.
# One CA signs everything: apiserver serving cert, client certs for the admin,
# controller manager and scheduler, and the apiserver's kubelet client cert
# (unused until a kubelet exists, but cheap). Fresh on every cold start.
# A second CA is the front-proxy (request-header) CA, as kubeadm sets up: the
# controller manager and scheduler read it from the
# extension-apiserver-authentication ConfigMap for delegated authentication
# and log an error every few seconds, forever, when it is missing; it also
# makes aggregated API servers work should a test need one.
cluster_pki() {
  log "generating certificates in $PKI"
  make_ca ca carve-test-ca
  make_ca front-proxy-ca carve-test-front-proxy-ca
  issue ca apiserver "/CN=kube-apiserver" "$server_ext"
  # system:masters bypasses RBAC: tests act as cluster admin.
  issue ca admin "/O=system:masters/CN=carve-admin" "$client_ext"
  # These user names are what the bootstrap RBAC roles are bound to.
  issue ca controller-manager "/CN=system:kube-controller-manager" "$client_ext"
  issue ca scheduler "/CN=system:kube-scheduler" "$client_ext"
  issue ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client_ext"
  issue front-proxy-ca front-proxy-client "/CN=front-proxy-client" "$client_ext"
  # Service-account tokens are signed with an RSA key: RS256 is what every
  # token consumer supports.
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null

  write_kubeconfig "$ADMIN_KUBECONFIG" carve-admin "$PKI/admin.crt" "$PKI/admin.key"
  write_kubeconfig "$STATE_DIR/controller-manager.kubeconfig" system:kube-controller-manager \
    "$PKI/controller-manager.crt" "$PKI/controller-manager.key"
  write_kubeconfig "$STATE_DIR/scheduler.kubeconfig" system:kube-scheduler \
    "$PKI/scheduler.crt" "$PKI/scheduler.key"
}
