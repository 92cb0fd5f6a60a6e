# shellcheck shell=bash disable=SC2154 # here, PKI, STATE_DIR, APISERVER_PORT, ...: set by up.sh
# The local cluster's certificates and kubeconfigs. Sourced by up.sh (not run
# on its own): it uses up.sh's variables (here, PKI, STATE_DIR,
# APISERVER_PORT, SERVICE_IP, ADMIN_KUBECONFIG) and log. node.sh uses issue
# and write_kubeconfig for the kubelet's. The cryptography is the Go program
# in ./pki (client-go's cert, keyutil and clientcmd); pki_prepare builds it.

# pki_prepare: builds the pki tool once per change of its sources (a no-op
# then; the first build is part of a cold start) and sets PKI_TOOL.
pki_prepare() {
  PKI_TOOL=$("$here/../gotool.sh" deploy/cluster/pki | tail -n1) ||
    { log "ERROR: building deploy/cluster/pki failed"; return 1; }
}

# write_kubeconfig FILE USER CERT KEY: a kubeconfig (mode 0600) with embedded
# credentials, so it stays valid if copied elsewhere.
write_kubeconfig() {
  "$PKI_TOOL" kubeconfig --out "$1" --user "$2" --cert "$3" --key "$4" \
    --ca-file "$PKI/ca.crt" --server "https://${APISERVER_HOST:-127.0.0.1}:$APISERVER_PORT"
}

# make_ca NAME CN: a self-signed EC P-256 CA, $PKI/NAME.crt and .key.
make_ca() {
  "$PKI_TOOL" ca --dir "$PKI" --name "$1" --cn "$2"
}

# issue CA NAME SUBJECT USAGE [SANS]: an EC P-256 key ($PKI/NAME.key) and a
# certificate for it ($PKI/NAME.crt) signed by CA (a make_ca name). SUBJECT
# is /O=ORG/CN=NAME; USAGE is client or server; SANS, which a server cert
# needs, is a list like IP:127.0.0.1,DNS:localhost.
issue() {
  "$PKI_TOOL" issue --dir "$PKI" --ca "$1" --name "$2" --subject "$3" --usage "$4" ${5:+--san "$5"}
}

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
  # Several nodes reach the API server on the node network's bridge.
  local extra=""
  [ "${APISERVER_HOST:-127.0.0.1}" = 127.0.0.1 ] || extra="IP:$APISERVER_HOST,"
  issue ca apiserver "/CN=kube-apiserver" server \
    "IP:127.0.0.1,${extra}IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  # system:masters bypasses RBAC: tests act as cluster admin.
  issue ca admin "/O=system:masters/CN=carve-admin" client
  # These user names are what the bootstrap RBAC roles are bound to.
  issue ca controller-manager "/CN=system:kube-controller-manager" client
  issue ca scheduler "/CN=system:kube-scheduler" client
  issue ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
  issue front-proxy-ca front-proxy-client "/CN=front-proxy-client" client
  # Service-account tokens are signed with an RSA key (sa.key, sa.pub).
  "$PKI_TOOL" signing-key --dir "$PKI" --name sa

  write_kubeconfig "$ADMIN_KUBECONFIG" carve-admin "$PKI/admin.crt" "$PKI/admin.key"
  write_kubeconfig "$STATE_DIR/controller-manager.kubeconfig" system:kube-controller-manager \
    "$PKI/controller-manager.crt" "$PKI/controller-manager.key"
  write_kubeconfig "$STATE_DIR/scheduler.kubeconfig" system:kube-scheduler \
    "$PKI/scheduler.crt" "$PKI/scheduler.key"
}
