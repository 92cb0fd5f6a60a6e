# shellcheck shell=bash disable=SC2154 # STATE_DIR, PKI, ETCD_PORT, ...: set by up.sh
# The local cluster's control plane: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler. Sourced by up.sh (not run on its
# own), which decides the order: it uses up.sh's variables (STATE_DIR, PKI,
# BIN_DIR, the ports, FEATURE_GATES, SERVICE_CIDR, USE_SA_CREDENTIALS,
# ADMIN_KUBECONFIG) and the helpers of daemons.sh (start_daemon, wait_for,
# pid_of, fail) and pki.sh (the certificates and kubeconfigs it reads).

# kubectl_ ARGS...: kubectl as the cluster admin.
kubectl_() { "$BIN_DIR/kubectl" --kubeconfig="$ADMIN_KUBECONFIG" --request-timeout=5s "$@"; }

# etcd_start: starts etcd and waits for it to listen.
# Plain HTTP on loopback: only the apiserver talks to it. --unsafe-no-fsync
# because the data is thrown away anyway and fsync dominates write latency on
# a VM disk.
etcd_start() {
  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  start_daemon etcd \
    --name=carve \
    --data-dir="$STATE_DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="carve=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync \
    --log-level=warn
  wait_for "etcd to listen" etcd port_open "$ETCD_PORT"
}

# apiserver_start: starts kube-apiserver; apiserver_wait_ready waits for it.
# - resource.k8s.io/v1 is GA and served by default in v1.37; the runtime-config
#   only makes that explicit (and keeps working if a default changes).
#   ValidatingAdmissionPolicy is GA and on by default, nothing to set.
# - --endpoint-reconciler-type=none: the reconciler would publish 127.0.0.1 as
#   the `kubernetes` Service endpoint, which is invalid for an Endpoints object.
# - TaintNodesByCondition is disabled because no kubelet ever clears the
#   not-ready taint it puts on new Node objects, so nothing would schedule onto
#   the fake nodes tests create.
# - --cert-dir points into the state dir so nothing is ever written to
#   /var/run/kubernetes (the default).
apiserver_start() {
  log "starting kube-apiserver on https://$APISERVER_HOST:$APISERVER_PORT"
  start_daemon kube-apiserver \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$APISERVER_HOST" \
    --advertise-address="$APISERVER_HOST" \
    --secure-port="$APISERVER_PORT" \
    --cert-dir="$PKI" \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC \
    --endpoint-reconciler-type=none \
    --disable-admission-plugins=TaintNodesByCondition \
    --allow-privileged=true \
    --runtime-config=resource.k8s.io/v1=true \
    --feature-gates="$FEATURE_GATES" \
    --profiling=false \
    --v=1
}

# /readyz (not /healthz) also waits for the RBAC bootstrap roles the
# controller manager and scheduler need.
apiserver_wait_ready() {
  wait_for "kube-apiserver /readyz" kube-apiserver kubectl_ get --raw /readyz
}

# controllers_start: starts kube-controller-manager and kube-scheduler;
# controllers_wait_ready waits for them.
#  - node-lifecycle-controller is off: with no kubelet it would mark every Node
#    NotReady and taint/evict from it. Several nodes (nodes.sh) have it on,
#    so a killed node is marked NotReady within 20 s (their kubelets renew
#    every 5 s) and its pods are evicted.
#  - --use-service-account-credentials: see USE_SA_CREDENTIALS in up.sh; the
#    token controller signs with --service-account-private-key-file.
#  - --flex-volume-plugin-dir: the default is under /usr/libexec, which the
#    controller manager would create.
#  - the cluster-signing files let the CSR signer issue kubelet certs later.
controllers_start() {
  log "starting kube-controller-manager and kube-scheduler"
  local controllers='*,-node-lifecycle-controller' lifecycle=()
  if [ "${NODES:-1}" != 1 ]; then
    controllers='*'
    lifecycle=(--node-monitor-grace-period=20s --node-monitor-period=2s)
  fi
  start_daemon kube-controller-manager \
    --kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$KCM_PORT" \
    --leader-elect=false \
    --controllers="$controllers" "${lifecycle[@]}" \
    --flex-volume-plugin-dir="$STATE_DIR/flexvolume" \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials="$USE_SA_CREDENTIALS" \
    --cluster-signing-cert-file="$PKI/ca.crt" \
    --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --feature-gates="$FEATURE_GATES" \
    --profiling=false \
    --v=1
  # The scheduler takes its client settings from a config file: with --config,
  # the old --kubeconfig/--leader-elect flags would be ignored.
  cat >"$STATE_DIR/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $STATE_DIR/scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
  start_daemon kube-scheduler \
    --config="$STATE_DIR/scheduler.yaml" \
    --authentication-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$SCHEDULER_PORT" \
    --feature-gates="$FEATURE_GATES" \
    --profiling=false \
    --v=1
}

# Pods cannot be created until the controller manager has made the namespace's
# `default` ServiceAccount; that is the sign it is working.
controllers_wait_ready() {
  wait_for "the default ServiceAccount" kube-controller-manager \
    kubectl_ get serviceaccount default --namespace default
  pid_of kube-scheduler >/dev/null || fail "kube-scheduler exited" kube-scheduler
}
