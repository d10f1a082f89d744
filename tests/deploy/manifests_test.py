#!/usr/bin/python3
"""Every YAML file in deploy/ parses, and every object in it uses only fields of its kind.

There is no cluster here, and `kubectl apply --dry-run=client` needs one (it asks the API
server for its resource list and schemas even in client mode; CRDs such as InferencePool would
need their schemas installed too). So this test carries its own table of the fields each kind
used in deploy/ may have (Deployment, Service, ConfigMap, ServiceAccount, Role, RoleBinding,
InferencePool v1, HTTPRoute v1, LeaderWorkerSet v1, and the endpoint picker's
EndpointPickerConfig held in a ConfigMap), with their types, and fails on any other field. The
tables name real fields of the upstream APIs only; extend them when a manifest needs another.

It also checks what ties the objects together (selectors match pod labels, ports and names
that refer to each other exist, $(VAR) references are defined, servers listen on 0.0.0.0, the
picker's KV-event and block-size settings match Peregrine's flags), and validates
deploy/compose.yaml with Debian's docker-compose (`config -q`: the Compose schema, offline).

A self-check runs broken manifests (a misspelled field, a v1alpha2 InferencePool field, a
label that is not a string, an undefined $(VAR), ...) through the same checks and fails unless
each is rejected.

usage: manifests_test.py [REPO_ROOT]"""
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml


# --- schema language ------------------------------------------------------------------------
class Obj:
    def __init__(self, fields, required=()):
        self.fields, self.required = fields, set(required)


class List:
    def __init__(self, item):
        self.item = item


class Map:  # string keys, values of one type
    def __init__(self, value):
        self.value = value


class Enum:
    def __init__(self, *values):
        self.values = set(values)


def obj(required=(), **fields):
    return Obj(fields, required)


S, I, B, N = "string", "integer", "boolean", "number"
IS = "integer or string"  # IntOrString
Q = "quantity"  # "1Gi", "500m", 2
ANY = "any"  # free-form: not checked


def type_ok(value, t):
    if t == S:
        return isinstance(value, str)
    if t == I:
        return isinstance(value, int) and not isinstance(value, bool)
    if t == B:
        return isinstance(value, bool)
    if t == N:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t in (IS, Q):
        return isinstance(value, (int, str)) and not isinstance(value, bool) or (t == Q and isinstance(value, float))
    raise ValueError(t)


def validate(value, schema, path, errors):
    if schema == ANY:
        return
    where = path or "(top)"
    if isinstance(schema, Obj):
        if not isinstance(value, dict):
            errors.append(f"{where}: expected an object, got {type(value).__name__}")
            return
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if k not in schema.fields:
                errors.append(f"{sub}: unknown field")
            else:
                validate(v, schema.fields[k], sub, errors)
        for r in sorted(schema.required - set(value)):
            errors.append(f"{path + '.' if path else ''}{r}: required field missing")
    elif isinstance(schema, List):
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            validate(v, schema.item, f"{path}[{i}]", errors)
    elif isinstance(schema, Map):
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{where}: key {k!r} is not a string")
            validate(v, schema.value, f"{path}[{k}]", errors)
    elif isinstance(schema, Enum):
        if value not in schema.values:
            errors.append(f"{where}: {value!r} is not one of {sorted(schema.values)}")
    elif not type_ok(value, schema):
        errors.append(f"{where}: expected {schema}, got {type(value).__name__} {value!r}")


# --- Kubernetes kinds (the fields of the upstream Go types, json names) ----------------------
STRS = List(S)
META = obj(required=("name",), name=S, namespace=S, labels=Map(S), annotations=Map(S))
LABEL_SELECTOR = obj(matchLabels=Map(S), matchExpressions=List(obj(
    required=("key", "operator"), key=S, operator=Enum("In", "NotIn", "Exists", "DoesNotExist"), values=STRS)))
KEY_REF = obj(required=("key",), name=S, key=S, optional=B)
ENV_VAR = obj(required=("name",), name=S, value=S, valueFrom=obj(
    fieldRef=obj(required=("fieldPath",), fieldPath=S, apiVersion=S),
    resourceFieldRef=obj(required=("resource",), resource=S, containerName=S, divisor=Q),
    configMapKeyRef=KEY_REF, secretKeyRef=KEY_REF))
ENV_FROM = obj(prefix=S, configMapRef=obj(name=S, optional=B), secretRef=obj(name=S, optional=B))
HTTP_GET = obj(required=("port",), path=S, port=IS, host=S, scheme=Enum("HTTP", "HTTPS"),
               httpHeaders=List(obj(required=("name", "value"), name=S, value=S)))
TCP_SOCKET = obj(required=("port",), port=IS, host=S)
EXEC = obj(command=STRS)
PROBE = obj(httpGet=HTTP_GET, tcpSocket=TCP_SOCKET, grpc=obj(required=("port",), port=I, service=S), exec=EXEC,
            initialDelaySeconds=I, periodSeconds=I, timeoutSeconds=I, successThreshold=I, failureThreshold=I,
            terminationGracePeriodSeconds=I)
HANDLER = obj(exec=EXEC, httpGet=HTTP_GET, tcpSocket=TCP_SOCKET, sleep=obj(required=("seconds",), seconds=I))
CONTAINER = obj(
    required=("name", "image"), name=S, image=S, imagePullPolicy=Enum("Always", "IfNotPresent", "Never"),
    command=STRS, args=STRS, workingDir=S, env=List(ENV_VAR), envFrom=List(ENV_FROM),
    ports=List(obj(required=("containerPort",), containerPort=I, name=S, protocol=Enum("TCP", "UDP", "SCTP"),
                   hostPort=I, hostIP=S)),
    resources=obj(limits=Map(Q), requests=Map(Q), claims=List(obj(name=S))),
    readinessProbe=PROBE, livenessProbe=PROBE, startupProbe=PROBE,
    lifecycle=obj(postStart=HANDLER, preStop=HANDLER),
    volumeMounts=List(obj(required=("name", "mountPath"), name=S, mountPath=S, readOnly=B, subPath=S,
                          subPathExpr=S, mountPropagation=S)),
    securityContext=obj(runAsUser=I, runAsGroup=I, runAsNonRoot=B, readOnlyRootFilesystem=B,
                        allowPrivilegeEscalation=B, privileged=B, capabilities=obj(add=STRS, drop=STRS)),
    stdin=B, tty=B, terminationMessagePath=S, terminationMessagePolicy=S)
VOLUME = obj(
    required=("name",), name=S,
    persistentVolumeClaim=obj(required=("claimName",), claimName=S, readOnly=B),
    emptyDir=obj(medium=S, sizeLimit=Q),
    configMap=obj(name=S, items=List(obj(key=S, path=S, mode=I)), defaultMode=I, optional=B),
    secret=obj(secretName=S, items=List(obj(key=S, path=S, mode=I)), defaultMode=I, optional=B),
    hostPath=obj(required=("path",), path=S, type=S))
POD_SPEC = obj(
    required=("containers",), containers=List(CONTAINER), initContainers=List(CONTAINER), volumes=List(VOLUME),
    serviceAccountName=S, automountServiceAccountToken=B, terminationGracePeriodSeconds=I,
    restartPolicy=Enum("Always", "OnFailure", "Never"), nodeSelector=Map(S),
    tolerations=List(obj(key=S, operator=S, value=S, effect=S, tolerationSeconds=I)),
    securityContext=obj(runAsUser=I, runAsGroup=I, runAsNonRoot=B, fsGroup=I),
    imagePullSecrets=List(obj(name=S)), priorityClassName=S, hostNetwork=B, hostIPC=B, dnsPolicy=S,
    enableServiceLinks=B, shareProcessNamespace=B, schedulerName=S, runtimeClassName=S, hostname=S, subdomain=S)
POD_TEMPLATE = obj(metadata=obj(labels=Map(S), annotations=Map(S), name=S), spec=POD_SPEC)


def kind(spec=None, required=("spec",), **top):
    fields = dict(apiVersion=S, kind=S, metadata=META, **top)
    if spec is not None:
        fields["spec"] = spec
    return Obj(fields, {"apiVersion", "kind", "metadata", *required})


DEPLOYMENT = kind(obj(
    required=("selector", "template"), replicas=I, selector=LABEL_SELECTOR, template=POD_TEMPLATE,
    strategy=obj(type=Enum("RollingUpdate", "Recreate"), rollingUpdate=obj(maxSurge=IS, maxUnavailable=IS)),
    minReadySeconds=I, revisionHistoryLimit=I, progressDeadlineSeconds=I, paused=B))
SERVICE = kind(obj(
    selector=Map(S), type=Enum("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"), clusterIP=S,
    clusterIPs=STRS, publishNotReadyAddresses=B, sessionAffinity=Enum("None", "ClientIP"),
    externalTrafficPolicy=S, internalTrafficPolicy=S, ipFamilyPolicy=S, ipFamilies=STRS, loadBalancerClass=S,
    ports=List(obj(required=("port",), port=I, targetPort=IS, name=S, protocol=Enum("TCP", "UDP", "SCTP"),
                   appProtocol=S, nodePort=I))))
CONFIG_MAP = kind(required=(), data=Map(S), binaryData=Map(S), immutable=B)
SERVICE_ACCOUNT = kind(required=(), automountServiceAccountToken=B, imagePullSecrets=List(obj(name=S)),
                       secrets=List(obj(name=S)))
ROLE = kind(required=(), rules=List(obj(required=("verbs",), apiGroups=STRS, resources=STRS, verbs=STRS,
                                        resourceNames=STRS)))
ROLE_BINDING = kind(
    required=("roleRef",),
    subjects=List(obj(required=("kind", "name"), kind=Enum("ServiceAccount", "User", "Group"), name=S,
                      namespace=S, apiGroup=S)),
    roleRef=obj(required=("apiGroup", "kind", "name"), apiGroup=S, kind=Enum("Role", "ClusterRole"), name=S))
# inference.networking.k8s.io/v1 (gateway-api-inference-extension api/v1/inferencepool_types.go):
# v1's selector has matchLabels only; v1alpha2's targetPortNumber/extensionRef are gone.
INFERENCE_POOL = kind(obj(
    required=("selector", "targetPorts", "endpointPickerRef"),
    selector=obj(required=("matchLabels",), matchLabels=Map(S)),
    targetPorts=List(obj(required=("number",), number=I)),
    appProtocol=Enum("http", "kubernetes.io/h2c"),
    endpointPickerRef=obj(required=("name",), group=S, kind=S, name=S, port=obj(required=("number",), number=I),
                          failureMode=Enum("FailOpen", "FailClose"))))
PARENT_REF = obj(required=("name",), group=S, kind=S, namespace=S, name=S, sectionName=S, port=I)
HTTP_ROUTE = kind(obj(
    parentRefs=List(PARENT_REF), hostnames=STRS,
    rules=List(obj(
        name=S,
        matches=List(obj(path=obj(type=Enum("Exact", "PathPrefix", "RegularExpression"), value=S),
                         headers=List(obj(type=S, name=S, value=S)), queryParams=List(obj(type=S, name=S, value=S)),
                         method=S)),
        filters=ANY,
        backendRefs=List(obj(required=("name",), group=S, kind=S, name=S, namespace=S, port=I, weight=I,
                             filters=ANY)),
        timeouts=obj(request=S, backendRequest=S)))))
# leaderworkerset.x-k8s.io/v1 (sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go)
LEADER_WORKER_SET = kind(obj(
    required=("leaderWorkerTemplate",), replicas=I, startupPolicy=S,
    leaderWorkerTemplate=obj(
        required=("workerTemplate",), leaderTemplate=POD_TEMPLATE, workerTemplate=POD_TEMPLATE, size=I,
        restartPolicy=S, subGroupPolicy=obj(subGroupPolicyType=S, subGroupSize=I),
        persistentVolumeClaimRetentionPolicy=obj(whenDeleted=S, whenScaled=S)),
    rolloutStrategy=obj(type=S, rollingUpdateConfiguration=obj(partition=I, maxUnavailable=IS, maxSurge=IS)),
    networkConfig=obj(subdomainPolicy=S)))

KINDS = {
    ("apps/v1", "Deployment"): DEPLOYMENT,
    ("v1", "Service"): SERVICE,
    ("v1", "ConfigMap"): CONFIG_MAP,
    ("v1", "ServiceAccount"): SERVICE_ACCOUNT,
    ("rbac.authorization.k8s.io/v1", "Role"): ROLE,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ROLE_BINDING,
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET,
}

# --- the endpoint picker's configuration (llm-d inference scheduler v0.8 / GAIE 1.5) -----------
PLUGIN_PARAMS = {
    # llm-d precise-prefix-cache-scorer; its sub-configs are llm-d-kv-cache's (docs/configuration.md).
    "precise-prefix-cache-scorer": obj(
        tokenProcessorConfig=obj(blockSize=I, blockSizeTokens=I, hashSeed=S),
        indexerConfig=obj(
            kvBlockIndexConfig=obj(inMemoryConfig=obj(size=I, podCacheSize=I), costAwareMemoryConfig=obj(size=S),
                                   redisConfig=obj(address=S, backendType=S, enableRDMA=B), enableMetrics=B,
                                   metricsLoggingInterval=IS),
            tokenizersPoolConfig=obj(
                modelName=S, workersCount=I,
                local=obj(autoDiscoveryDir=S, autoDiscoveryTokenizerFileName=S, modelTokenizerMap=Map(S)),
                hf=obj(enabled=B, huggingFaceToken=S, tokenizersCacheDir=S), uds=obj(socketFile=S)),
            kvCacheBackendConfigs=List(obj(name=S, weight=N))),
        kvEventsConfig=obj(zmqEndpoint=S, topicFilter=S, concurrency=I, engineType=Enum("vllm", "sglang"),
                           discoverPods=B,
                           podDiscoveryConfig=obj(podLabelSelector=S, podNamespace=S, socketPort=I)),
        speculativeIndexing=B, speculativeTTL=S),
    "core-metrics-extractor": obj(
        engineLabelKey=S, defaultEngine=S,
        engineConfigs=List(obj(required=("name",), name=S, queuedRequestsSpec=S, runningRequestsSpec=S,
                               kvUsageSpec=S, loraSpec=S, cacheInfoSpec=S))),
    "metrics-data-source": obj(scheme=Enum("http", "https"), path=S, insecureSkipVerify=B),
    "endpoint-notification-source": obj(),
    "single-profile-handler": obj(),
    "queue-scorer": obj(),
    "kv-cache-utilization-scorer": obj(),
    "max-score-picker": obj(maxNumOfEndpoints=I),
}
REF = obj(required=("pluginRef",), pluginRef=S)
EPP_CONFIG = Obj(dict(
    apiVersion=Enum("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1"), kind=Enum("EndpointPickerConfig"),
    featureGates=STRS,
    plugins=List(obj(required=("type",), name=S, type=S, parameters=ANY)),
    schedulingProfiles=List(obj(required=("name", "plugins"), name=S,
                                plugins=List(obj(required=("pluginRef",), pluginRef=S, weight=N))),),
    saturationDetector=REF, parser=REF, flowControl=ANY,
    dataLayer=obj(sources=List(obj(required=("pluginRef",), pluginRef=S, extractors=List(REF))),
                  discovery=REF, injectDefaults=B)), {"apiVersion", "kind", "plugins", "schedulingProfiles"})

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def check_epp_config(cfg, where, errors):
    """An EndpointPickerConfig: fields, each plugin's parameters, and references to plugins."""
    errs = []
    validate(cfg, EPP_CONFIG, "", errs)
    errors += [f"{where}: {e}" for e in errs]
    if errs:
        return
    names = set()
    for i, p in enumerate(cfg["plugins"]):
        names.add(p.get("name") or p["type"])
        schema = PLUGIN_PARAMS.get(p["type"])
        if schema is None:
            errors.append(f"{where}: plugins[{i}]: no schema for plugin type {p['type']!r} in this test")
        elif "parameters" in p:
            errs = []
            validate(p["parameters"], schema, f"plugins[{i}].parameters", errs)
            errors += [f"{where}: {e} ({p['type']})" for e in errs]
    refs = [pp["pluginRef"] for prof in cfg["schedulingProfiles"] for pp in prof["plugins"]]
    for src in (cfg.get("dataLayer") or {}).get("sources", []):
        refs += [src["pluginRef"]] + [e["pluginRef"] for e in src.get("extractors", [])]
    for r in refs:
        if r not in names:
            errors.append(f"{where}: pluginRef {r!r} names no plugin")


def check_object(doc, where, errors):
    key = (doc.get("apiVersion"), doc.get("kind"))
    schema = KINDS.get(key)
    if schema is None:
        errors.append(f"{where}: no schema for apiVersion {key[0]!r} kind {key[1]!r} in this test")
        return
    errs = []
    validate(doc, schema, "", errs)
    errors += [f"{where}: {e}" for e in errs]
    name = (doc.get("metadata") or {}).get("name", "")
    if isinstance(name, str) and not (DNS_SUBDOMAIN.match(name) and len(name) <= 253):
        errors.append(f"{where}: metadata.name {name!r} is not a DNS subdomain name")
    for path, labels in label_maps(doc):
        for k, v in labels.items():
            if isinstance(v, str) and not (LABEL_VALUE.match(v) and len(v) <= 63):
                errors.append(f"{where}: {path}[{k}]: {v!r} is not a valid label value")
    for path, c in containers(doc):
        if isinstance(c.get("name"), str) and not DNS_LABEL.match(c["name"]):
            errors.append(f"{where}: {path}.name {c['name']!r} is not a DNS label")
        for p in c.get("ports") or []:
            n = p.get("name")
            if isinstance(n, str) and not (PORT_NAME.match(n) and len(n) <= 15):
                errors.append(f"{where}: {path}.ports: name {n!r} is not a port name (15 characters at most)")
        argv = [str(w) for w in (c.get("command") or []) + (c.get("args") or [])]
        if argv and os.path.basename(argv[0]) == "peregrine" and len(argv) > 1 and argv[1] in ("serve", "router"):
            port = int(flag(argv, "--port", "8000"))
            if port in [p.get("containerPort") for p in c.get("ports") or []] and \
                    flag(argv, "--host", "127.0.0.1") not in ("0.0.0.0", "::"):
                errors.append(f"{where}: {path}: peregrine {argv[1]} serves port {port} on "
                              f"{flag(argv, '--host', '127.0.0.1')}, unreachable from outside the pod")
        # Kubernetes expands $(VAR) in command/args only for variables of the container's env;
        # any other reference stays in the text as is.
        defined = {e.get("name") for e in c.get("env") or []}
        if key[1] == "LeaderWorkerSet":  # added to every container by the LWS webhook
            defined |= {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}
        for word in (c.get("command") or []) + (c.get("args") or []):
            for var in VAR_REF.findall(str(word)):
                if var not in defined:
                    errors.append(f"{where}: {path}: $({var}) is not defined in the container's env")
    if key == ("v1", "ConfigMap"):
        for k, text in (doc.get("data") or {}).items():
            try:
                sub = yaml.safe_load(text) if isinstance(text, str) else None
            except yaml.YAMLError as e:
                errors.append(f"{where}: data[{k}] does not parse: {e}")
                continue
            if isinstance(sub, dict) and sub.get("kind") == "EndpointPickerConfig":
                check_epp_config(sub, f"{where}: data[{k}]", errors)
    if key == ("inference.networking.k8s.io/v1", "InferencePool") and not errs:
        ports = [p["number"] for p in doc["spec"]["targetPorts"]]
        if not 1 <= len(ports) <= 8 or len(set(ports)) != len(ports):
            errors.append(f"{where}: spec.targetPorts: 1 to 8 unique numbers, got {ports}")
        ref = doc["spec"]["endpointPickerRef"]
        if ref.get("kind", "Service") == "Service" and "port" not in ref:
            errors.append(f"{where}: spec.endpointPickerRef.port is required for a Service")


def label_maps(doc):
    meta = doc.get("metadata") or {}
    if isinstance(meta.get("labels"), dict):
        yield "metadata.labels", meta["labels"]
    for path, tmpl in pod_templates(doc):
        labels = (tmpl.get("metadata") or {}).get("labels")
        if isinstance(labels, dict):
            yield f"{path}.metadata.labels", labels


def pod_templates(doc):
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    if doc.get("kind") == "Deployment" and isinstance(spec.get("template"), dict):
        yield "spec.template", spec["template"]
    if doc.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        for k in ("leaderTemplate", "workerTemplate"):
            if isinstance(lwt.get(k), dict):
                yield f"spec.leaderWorkerTemplate.{k}", lwt[k]


def containers(doc):
    for path, tmpl in pod_templates(doc):
        for i, c in enumerate(((tmpl.get("spec") or {}).get("containers") or [])):
            if isinstance(c, dict):
                yield f"{path}.spec.containers[{i}]", c


def pod_labels(doc, tmpl):
    labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
    if doc.get("kind") == "LeaderWorkerSet":  # set by the LWS controller on every pod
        labels["leaderworkerset.sigs.k8s.io/name"] = doc["metadata"]["name"]
    return labels


def flag(argv, name, default=None):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def expand(value, container):
    env = {e["name"]: e.get("value") for e in container.get("env") or [] if "value" in e}
    return VAR_REF.sub(lambda m: env.get(m.group(1)) or m.group(0), value)


def check_links(docs, errors):
    """What the objects of one directory say about each other. docs: [(where, doc)]."""
    by_kind = {}
    for where, d in docs:
        by_kind.setdefault(d.get("kind"), []).append((where, d))
    pods = []  # (where, workload, template labels, template)
    for where, d in docs:
        for path, tmpl in pod_templates(d):
            pods.append((where, d, pod_labels(d, tmpl), tmpl))
        if d.get("kind") == "Deployment":
            sel = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            tl = pod_labels(d, d["spec"]["template"])
            if any(tl.get(k) != v for k, v in sel.items()):
                errors.append(f"{where}: spec.selector.matchLabels {sel} do not match the template's labels")

    def selected(sel):
        return [p for p in pods if sel and all(p[2].get(k) == v for k, v in sel.items())]

    def container_ports(pod):
        ports = {}
        for c in (pod[3].get("spec") or {}).get("containers") or []:
            for p in c.get("ports") or []:
                ports[p.get("containerPort")] = p
                if p.get("name"):
                    ports[p["name"]] = p
        return ports

    services = {d["metadata"]["name"]: (where, d) for where, d in by_kind.get("Service", [])}
    for where, d in by_kind.get("Service", []):
        sel = (d.get("spec") or {}).get("selector")
        if not sel:
            continue
        targets = selected(sel)
        if not targets:
            errors.append(f"{where}: Service selector {sel} matches no pod template in this directory")
        for p in (d["spec"].get("ports") or []):
            tp = p.get("targetPort", p.get("port"))
            for t in targets:
                if tp not in container_ports(t):
                    errors.append(f"{where}: Service port {p.get('port')} targets {tp!r}, not a container port of {t[0]}")

    names = {k: {d["metadata"]["name"] for _, d in v} for k, v in by_kind.items()}
    for where, d in docs:
        for path, tmpl in pod_templates(d):
            spec = tmpl.get("spec") or {}
            sa = spec.get("serviceAccountName")
            if sa and sa not in names.get("ServiceAccount", set()):
                errors.append(f"{where}: serviceAccountName {sa!r}: no such ServiceAccount here")
            for v in spec.get("volumes") or []:
                cm = (v.get("configMap") or {}).get("name")
                if cm and cm not in names.get("ConfigMap", set()):
                    errors.append(f"{where}: volume {v['name']!r}: no ConfigMap {cm!r} here")
    for where, d in by_kind.get("RoleBinding", []):
        if d["roleRef"]["kind"] == "Role" and d["roleRef"]["name"] not in names.get("Role", set()):
            errors.append(f"{where}: roleRef: no Role {d['roleRef']['name']!r} here")
        for s in d.get("subjects") or []:
            if s["kind"] == "ServiceAccount" and s["name"] not in names.get("ServiceAccount", set()):
                errors.append(f"{where}: subject: no ServiceAccount {s['name']!r} here")
    for where, d in by_kind.get("HTTPRoute", []):
        for rule in d["spec"].get("rules") or []:
            for b in rule.get("backendRefs") or []:
                k = b.get("kind", "Service")
                if b["name"] not in names.get(k, set()):
                    errors.append(f"{where}: backendRef: no {k} {b['name']!r} here")

    for where, pool in by_kind.get("InferencePool", []):
        spec = pool["spec"]
        members = selected(spec["selector"]["matchLabels"])
        if not members:
            errors.append(f"{where}: the InferencePool selector matches no pod template here")
        target_ports = [p["number"] for p in spec["targetPorts"]]
        for m in members:
            for n in target_ports:
                if n not in container_ports(m):
                    errors.append(f"{where}: targetPort {n} is not a container port of {m[0]}")
        ref = spec["endpointPickerRef"]
        svc = services.get(ref["name"])
        if svc is None:
            errors.append(f"{where}: endpointPickerRef: no Service {ref['name']!r} here")
        elif ref["port"]["number"] not in [p["port"] for p in svc[1]["spec"].get("ports") or []]:
            errors.append(f"{where}: endpointPickerRef port {ref['port']['number']} is not a port of {ref['name']}")
        check_picker(pool, members, docs, by_kind, errors)

    for where, d in docs:  # peregrine router --backend-dns NAME:PORT -> a headless Service
        for path, c in containers(d):
            argv = (c.get("command") or []) + (c.get("args") or [])
            dns = flag(argv, "--backend-dns")
            if not dns:
                continue
            host, _, port = dns.rpartition(":")
            svc = services.get(host.split(".")[0])
            if svc is None:
                errors.append(f"{where}: --backend-dns {dns}: no Service {host.split('.')[0]!r} here")
                continue
            if svc[1]["spec"].get("clusterIP") != "None":
                errors.append(f"{where}: --backend-dns {dns}: Service is not headless (clusterIP: None), "
                              "DNS would give one virtual IP instead of the replicas")
            if not port.isdigit() or int(port) not in [p["port"] for p in svc[1]["spec"].get("ports") or []]:
                errors.append(f"{where}: --backend-dns {dns}: port is not a port of the Service")


def check_picker(pool, members, docs, by_kind, errors):
    """The endpoint picker of a pool against the pool's Peregrine pods: the picker runs with
    --pool-name of this pool and --config-file of its mounted config; the prefix-cache scorer's
    KV-event port, topic filter, block size and tokenizer model match the replicas' flags."""
    pname = pool["metadata"]["name"]
    svc = next((x for _, x in by_kind.get("Service", [])
                if x["metadata"]["name"] == pool["spec"]["endpointPickerRef"]["name"]), None)
    pickers = 0
    for where, d in by_kind.get("Deployment", []):
        for path, c in containers(d):
            argv = c.get("args") or []
            if flag(argv, "--pool-name") != pname:
                continue
            pickers += 1
            sel = (svc or {}).get("spec", {}).get("selector") or {}
            labels = pod_labels(d, d["spec"]["template"])
            if svc and (not sel or any(labels.get(k) != v for k, v in sel.items())):
                errors.append(f"{where}: the picker's pods are not selected by the endpointPickerRef "
                              f"Service {svc['metadata']['name']!r}")
            cfg_path = flag(argv, "--config-file")
            tmpl_spec = d["spec"]["template"]["spec"]
            cfg = None
            for m in c.get("volumeMounts") or []:
                if cfg_path and cfg_path.startswith(m["mountPath"].rstrip("/") + "/"):
                    vol = next((v for v in tmpl_spec.get("volumes") or [] if v["name"] == m["name"]), {})
                    cm_name = (vol.get("configMap") or {}).get("name")
                    cm = next((x for _, x in by_kind.get("ConfigMap", []) if x["metadata"]["name"] == cm_name), None)
                    key = cfg_path[len(m["mountPath"].rstrip("/")) + 1:]
                    if cm and key in (cm.get("data") or {}):
                        cfg = yaml.safe_load(cm["data"][key])
            if cfg is None:
                errors.append(f"{where}: picker --config-file {cfg_path}: not a key of a mounted ConfigMap")
                continue
            for p in cfg.get("plugins") or []:
                if p.get("type") == "precise-prefix-cache-scorer":
                    check_kv_events(where, p.get("parameters") or {}, pool, members, errors)
    if pickers != 1:
        errors.append(f"InferencePool {pname!r}: {pickers} picker Deployments run with --pool-name {pname}, expected 1")


def check_kv_events(where, params, pool, members, errors):
    ev = params.get("kvEventsConfig") or {}
    socket_port = (ev.get("podDiscoveryConfig") or {}).get("socketPort")
    topic_filter = ev.get("topicFilter", "kv@")
    block = (params.get("tokenProcessorConfig") or {}).get("blockSize")
    tok_model = ((params.get("indexerConfig") or {}).get("tokenizersPoolConfig") or {}).get("modelName")
    target_ports = {p["number"] for p in pool["spec"]["targetPorts"]}
    for m in members:
        for c in (m[3].get("spec") or {}).get("containers") or []:
            argv = (c.get("command") or []) + (c.get("args") or [])
            if not argv or os.path.basename(argv[0]) != "peregrine" or "serve" not in argv:
                continue
            endpoint, topic = flag(argv, "--kv-events-endpoint"), flag(argv, "--kv-events-topic")
            if not endpoint or not topic:
                errors.append(f"{m[0]}: the pool's replicas publish no KV events (--kv-events-endpoint/-topic)")
                continue
            if ev.get("discoverPods", True) and not endpoint.endswith(f":{socket_port}"):
                errors.append(f"{where}: socketPort {socket_port} but the replicas bind {endpoint}")
            if not topic.startswith(topic_filter):
                errors.append(f"{where}: topicFilter {topic_filter!r} does not take the topic {topic!r}")
            parts = topic.split("@")
            served = expand(flag(argv, "--served-model-name", ""), c)
            if len(parts) != 3:
                errors.append(f"{m[0]}: --kv-events-topic {topic!r} is not kv@<pod>@<model>")
            else:
                pod, model = parts[1], expand(parts[2], c)
                if "$(POD_IP)" not in pod:
                    errors.append(f"{m[0]}: the topic's pod part {pod!r} does not name the pod's IP")
                port = pod.partition(":")[2]
                if port and int(port) not in target_ports:
                    errors.append(f"{m[0]}: the topic's pod part {pod!r}: port not a target port of the pool")
                if served and model != served:
                    errors.append(f"{m[0]}: topic model {model!r} is not --served-model-name {served!r}")
                if tok_model and tok_model != model:
                    errors.append(f"{where}: tokenizer model {tok_model!r} is not the replicas' model {model!r}")
            ip_env = [e for e in c.get("env") or [] if e.get("name") == "POD_IP"]
            if not ip_env or ((ip_env[0].get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") != "status.podIP":
                errors.append(f"{m[0]}: POD_IP must come from fieldRef status.podIP")
            replica_block = int(flag(argv, "--block-size", "16"))
            if block is not None and block != replica_block:
                errors.append(f"{where}: tokenProcessorConfig.blockSize {block} != the replicas' --block-size {replica_block}")


# --- docker compose ---------------------------------------------------------------------------
def check_compose(path, doc, errors):
    dc = shutil.which("docker-compose")
    if dc is None:
        errors.append(f"{path}: docker-compose not found (Debian package docker-compose)")
    else:
        p = subprocess.run([dc, "-f", path, "config", "-q"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            errors.append(f"{path}: docker-compose config: {(p.stdout + p.stderr).strip()}")
    services = doc.get("services") or {}
    for name, svc in services.items():
        if "healthcheck" not in svc:
            errors.append(f"{path}: services.{name}: no healthcheck")
        cmd = svc.get("command") or []
        cmd = shlex.split(cmd) if isinstance(cmd, str) else [str(x) for x in cmd]
        if cmd[:1] in (["serve"], ["router"]) and flag(cmd, "--host", "127.0.0.1") not in ("0.0.0.0", "::"):
            errors.append(f"{path}: services.{name}: {cmd[0]} listens on {flag(cmd, '--host', '127.0.0.1')}, "
                          "unreachable from the other containers")
        backends = [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "--backend"]
        for b in backends:
            m = re.match(r"^https?://([^:/]+)(?::(\d+))?", b)
            host = m.group(1) if m else None
            if host not in services:
                errors.append(f"{path}: services.{name}: --backend {b}: no service {host!r}")
                continue
            cond = ((svc.get("depends_on") or {}).get(host) or {}).get("condition") \
                if isinstance(svc.get("depends_on"), dict) else None
            if cond != "service_healthy":
                errors.append(f"{path}: services.{name}: depends_on.{host}.condition should be service_healthy")


# --- self-check -------------------------------------------------------------------------------
BAD = [
    ("a misspelled probe field", "readinessProbe.periodSecond: unknown field", """
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers:
        - name: x
          image: x
          readinessProbe: {httpGet: {path: /health, port: 8000}, periodSecond: 5}
"""),
    ("a v1alpha2 InferencePool field in v1", "spec.targetPortNumber: unknown field", """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: x}
spec:
  selector: {matchLabels: {app: x}}
  targetPortNumber: 8000
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
"""),
    ("matchExpressions in a v1 InferencePool selector", "selector.matchExpressions: unknown field", """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: x}
spec:
  selector: {matchLabels: {app: x}, matchExpressions: []}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
"""),
    ("a label value that is not a string", "expected string", """
apiVersion: v1
kind: Service
metadata: {name: x, labels: {inference-serving: true}}
spec: {ports: [{port: 80}]}
"""),
    ("an undefined $(VAR)", "$(POD_IPP) is not defined", """
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers:
        - name: x
          image: x
          args: ["serve", "--kv-events-topic", "kv@$(POD_IPP)@m"]
          env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
"""),
    ("a misspelled scorer parameter in the picker's config", "kvEventConfig: unknown field", """
apiVersion: v1
kind: ConfigMap
metadata: {name: x}
data:
  c.yaml: |
    apiVersion: inference.networking.x-k8s.io/v1alpha1
    kind: EndpointPickerConfig
    plugins:
      - type: precise-prefix-cache-scorer
        parameters: {kvEventConfig: {topicFilter: "kv@"}}
      - type: max-score-picker
    schedulingProfiles:
      - name: default
        plugins: [{pluginRef: precise-prefix-cache-scorer}, {pluginRef: max-score-picker}]
"""),
    ("an unknown kind", "no schema for apiVersion", """
apiVersion: apps/v1
kind: DaemonSett
metadata: {name: x}
"""),
]


def self_check():
    problems = []
    for what, expect, text in BAD:
        errors = []
        check_object(yaml.safe_load(text), "self-check", errors)
        if not any(expect in e for e in errors):
            problems.append(f"self-check: {what} was not rejected (expected {expect!r}; got {errors})")
    # A broken link: a Service selecting no pods.
    errors = []
    docs = list(yaml.safe_load_all(BAD[0][2])) + [yaml.safe_load(BAD[3][2].replace("spec: {", "spec: {selector: {app: y}, "))]
    check_links([("self-check", d) for d in docs], errors)
    if not any("matches no pod template" in e for e in errors):
        problems.append(f"self-check: a Service selecting no pods was not rejected (got {errors})")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    errors = self_check()
    if errors:
        for e in errors:
            print("  " + e, file=sys.stderr)
        print("manifests test: FAILED: the self-check did not reject broken manifests")
        return 1

    files, kinds = 0, {}
    by_dir = {}
    for dirpath, _, names in sorted(os.walk(os.path.join(root, "deploy"))):
        for f in sorted(names):
            if not f.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            files += 1
            try:
                with open(path) as fh:
                    docs = [d for d in yaml.safe_load_all(fh) if d is not None]
            except yaml.YAMLError as e:
                errors.append(f"{rel}: does not parse: {e}")
                continue
            for i, doc in enumerate(docs):
                where = f"{rel} (doc {i + 1})"
                if not isinstance(doc, dict):
                    errors.append(f"{where}: not a mapping")
                elif "apiVersion" in doc:
                    kinds[doc.get("kind")] = kinds.get(doc.get("kind"), 0) + 1
                    check_object(doc, f"{where} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}", errors)
                    by_dir.setdefault(dirpath, []).append((where, doc))
                elif "services" in doc:
                    kinds["compose"] = kinds.get("compose", 0) + 1
                    check_compose(path, doc, errors)
                else:
                    errors.append(f"{where}: neither a Kubernetes object nor a compose file")
    if not errors:  # links only between objects that passed their schema
        for d, docs in by_dir.items():
            check_links(docs, errors)
    if files == 0:
        errors.append("no YAML file in deploy/")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    if errors:
        for e in errors:
            print("  " + e, file=sys.stderr)
        print(f"manifests test: FAILED: {len(errors)} problems in {files} YAML files ({summary})")
        return 1
    print(f"manifests test: ok ({files} YAML files: {summary}; self-check rejected {len(BAD) + 1} broken manifests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
