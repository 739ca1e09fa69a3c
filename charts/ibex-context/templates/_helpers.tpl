{{/* Every define is prefixed with the chart name: defines are global across subcharts. */}}

{{- define "ibex-context.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name; also the service Deployment's name, which the operator uses for the
profiles ConfigMap (<fullname>-profiles) and the HPA (<fullname>). Truncated to 52 characters so
every derived name ("-operator", "-postgresql", "-headless", ...) stays within 63.
*/}}
{{- define "ibex-context.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ibex-context.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels (immutable on Deployments): name + instance; callers add the component. */}}
{{- define "ibex-context.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ibex-context.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ibex-context.labels" -}}
helm.sh/chart: {{ include "ibex-context.chart" . }}
{{ include "ibex-context.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ibex-context
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Per-component labels: pass (dict "ctx" $ "component" "server"). */}}
{{- define "ibex-context.componentLabels" -}}
{{ include "ibex-context.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ibex-context.componentSelectorLabels" -}}
{{ include "ibex-context.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ibex-context.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ibex-context.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ibex-context.operatorFullname" -}}
{{- printf "%s-operator" (include "ibex-context.fullname" .) }}
{{- end }}

{{- define "ibex-context.operatorServiceAccountName" -}}
{{- default (include "ibex-context.operatorFullname" .) .Values.operator.serviceAccount.name }}
{{- end }}

{{/* The operator renders this ConfigMap; the chart renders it only when the operator is off. */}}
{{- define "ibex-context.profilesConfigMapName" -}}
{{- printf "%s-profiles" (include "ibex-context.fullname" .) }}
{{- end }}

{{/* The Secret holding the external stores' URLs (and optional keys): the user's, release-scoped by default. */}}
{{- define "ibex-context.storesSecretName" -}}
{{- default (printf "%s-stores" (include "ibex-context.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{/* The label that puts a ContextProfile under this release's operator. */}}
{{- define "ibex-context.profileSelectorLabel" -}}
context.ibex.dev/release: {{ .Release.Name | quote }}
{{- end }}

{{- define "ibex-context.defaultProfileName" -}}
{{- default (printf "%s-default" (include "ibex-context.fullname" .)) .Values.defaultProfile.name }}
{{- end }}

{{/* The chart-owned Secret: generated nonce secret and the in-chart stores' URLs. */}}
{{- define "ibex-context.generatedSecretName" -}}
{{- printf "%s-generated" (include "ibex-context.fullname" .) }}
{{- end }}

{{- define "ibex-context.generatedSecretEnabled" -}}
{{- if or .Values.secrets.generateNonceSecret .Values.redis.enabled .Values.postgresql.enabled }}true{{ end }}
{{- end }}

{{- define "ibex-context.redisFullname" -}}
{{- printf "%s-redis" (include "ibex-context.fullname" .) }}
{{- end }}

{{- define "ibex-context.postgresqlFullname" -}}
{{- printf "%s-postgresql" (include "ibex-context.fullname" .) }}
{{- end }}

{{/*
An image reference: [registry/]repository(@digest|:tag). global.imageRegistry, when set, replaces every
image's registry (a mirror or pull-through cache). Pass (dict "ctx" $ "image" .Values.redis.image).
*/}}
{{- define "ibex-context.imageRef" -}}
{{- $image := .image }}
{{- $registry := default ($image.registry | default "") ((.ctx.Values.global).imageRegistry) }}
{{- $repository := $image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- if $image.digest }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (toString $image.tag) }}
{{- end }}
{{- end }}

{{/* No default repository: a bare name would resolve to docker.io, where no image is published. */}}
{{- define "ibex-context.image" -}}
{{- $_ := required "image.repository is required: the registry/name you pushed the ibex-context image to (no public image is published)" .Values.image.repository }}
{{- $image := merge (dict "tag" (default .Chart.AppVersion .Values.image.tag)) .Values.image }}
{{- include "ibex-context.imageRef" (dict "ctx" . "image" $image) }}
{{- end }}

{{/* The pod's imagePullSecrets: global.imagePullSecrets then imagePullSecrets (every pod, test pod too). */}}
{{- define "ibex-context.imagePullSecrets" -}}
{{- $secrets := concat (((.Values.global).imagePullSecrets) | default list) .Values.imagePullSecrets }}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Environment entries from a map of NAME: value, where a value is a scalar (rendered as `value`) or
{valueFrom: {...}} (a Secret or ConfigMap key, a field or resource reference).
*/}}
{{- define "ibex-context.envEntries" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
{{- if kindIs "map" $value }}
  valueFrom:
    {{- toYaml $value.valueFrom | nindent 4 }}
{{- else }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when an HPA owns the service Deployment's replica count: the chart's, or the operator's
(which renders one only with autoscaling.enabled). */}}
{{- define "ibex-context.hpaOwnsReplicas" -}}
{{- if .Values.autoscaling.enabled }}true{{ end }}
{{- end }}

{{/*
The Deployment's replicas while an HPA owns them: the live count on upgrades (never reset what the HPA
chose), minReplicas on first install, so the service does not run one pod until the HPA exists.
*/}}
{{- define "ibex-context.initialReplicas" -}}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (include "ibex-context.fullname" .) }}
{{- if and $live $live.spec $live.spec.replicas }}
{{- $live.spec.replicas }}
{{- else }}
{{- .Values.autoscaling.minReplicas }}
{{- end }}
{{- end }}

{{/* Checks JSON Schema cannot express; included by the service Deployment. */}}
{{- define "ibex-context.validate" -}}
{{- $tls := .Values.security.tls }}
{{- if and $tls.enabled $tls.certManager.enabled (not $tls.certManager.issuerRef.name) }}
{{- fail "security.tls.certManager.issuerRef.name is required when security.tls.certManager.enabled" }}
{{- end }}
{{- if and $tls.clientCA.enabled (not $tls.clientCA.secretName) }}
{{- fail "security.tls.clientCA.secretName is required when security.tls.clientCA.enabled" }}
{{- end }}
{{- if and $tls.clientCA.enabled (not $tls.enabled) }}
{{- fail "security.tls.clientCA.enabled needs security.tls.enabled" }}
{{- end }}
{{- include "ibex-context.validateStores" . }}
{{- include "ibex-context.validateAuth" . }}
{{- $as := .Values.autoscaling }}
{{- if gt (int $as.minReplicas) (int $as.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%v) must not exceed autoscaling.maxReplicas (%v)" $as.minReplicas $as.maxReplicas) }}
{{- end }}
{{- end }}

{{/* Termination grace: preStop sleep + drain delay + in-flight grace + margin. */}}
{{- define "ibex-context.terminationGracePeriodSeconds" -}}
{{- $s := .Values.server.shutdown }}
{{- add $s.preStopSleepSeconds $s.drainDelaySeconds $s.graceSeconds $s.terminationMarginSeconds }}
{{- end }}

{{/*
A value of a chart-owned Secret that survives upgrades: the live Secret's value when it exists
(lookup returns nothing under `helm template`, so a fresh random value is rendered there).
Pass (dict "ctx" $ "key" "nonce-secret" "length" 48), and "secret" NAME for another Secret than
<fullname>-generated.
*/}}
{{- define "ibex-context.persistentRandom" -}}
{{- $secret := .secret | default (include "ibex-context.generatedSecretName" .ctx) }}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace $secret }}
{{- if and $existing $existing.data (hasKey $existing.data .key) }}
{{- index $existing.data .key | b64dec }}
{{- else }}
{{- randAlphaNum (int .length) }}
{{- end }}
{{- end }}

{{/* The PostgreSQL password of the in-chart store (stable across upgrades). */}}
{{- define "ibex-context.postgresqlPassword" -}}
{{- include "ibex-context.persistentRandom" (dict "ctx" . "key" "postgres-password" "length" 32) }}
{{- end }}

{{/* Environment of the service container: the stores, embedder and logging. */}}
{{- define "ibex-context.storeEnv" -}}
- name: IBEX_REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- if .Values.redis.enabled }}
      name: {{ include "ibex-context.generatedSecretName" . }}
      key: redis-url
      {{- else }}
      name: {{ include "ibex-context.storesSecretName" . }}
      key: {{ .Values.secrets.keys.redisUrl }}
      {{- end }}
{{ include "ibex-context.migrateEnv" . }}
{{- end }}

{{/*
Environment of the migrations (the hook Job, the init container): PostgreSQL only. Never the Redis URL:
the in-chart Redis's comes from the chart's own Secret, which a pre-install hook would wait for in vain.
*/}}
{{- define "ibex-context.migrateEnv" -}}
- name: IBEX_POSTGRES_DSN
  valueFrom:
    secretKeyRef:
      {{- if .Values.postgresql.enabled }}
      name: {{ include "ibex-context.generatedSecretName" . }}
      key: postgres-dsn
      {{- else }}
      name: {{ include "ibex-context.storesSecretName" . }}
      key: {{ .Values.secrets.keys.postgresDsn }}
      {{- end }}
- name: IBEX_EMBEDDER
  value: {{ .Values.config.embedder | quote }}
- name: IBEX_EMBEDDING_DIM
  value: {{ .Values.config.embeddingDim | quote }}
- name: IBEX_LOG_LEVEL
  value: {{ .Values.config.logLevel | quote }}
- name: IBEX_LOG_FORMAT
  value: {{ .Values.config.logFormat | quote }}
{{- end }}

{{/* Volume mounts every container of ours needs on a read-only root filesystem. */}}
{{- define "ibex-context.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* Server processes per pod: server.workers, or (0) one per CPU requested, rounded up. */}}
{{- define "ibex-context.workers" -}}
{{- $server := .Values.server -}}
{{- if gt (int $server.workers) 0 -}}
{{- int $server.workers -}}
{{- else -}}
{{- $cpu := toString ((($server.resources).requests).cpu | default "1") -}}
{{- if hasSuffix "m" $cpu -}}
{{- max 1 (div (add (int (trimSuffix "m" $cpu)) 999) 1000) -}}
{{- else -}}
{{- max 1 (int (ceil (float64 $cpu))) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The metrics port name of worker i (worker 0 keeps the historical name). */}}
{{- define "ibex-context.metricsPortName" -}}
{{- if eq (int .) 0 -}}http-metrics{{- else -}}http-metrics-{{ . }}{{- end -}}
{{- end -}}

{{/* The Secret holding the gRPC port's certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "ibex-context.tlsSecretName" -}}
{{- .Values.security.tls.secretName | default (printf "%s-tls" (include "ibex-context.fullname" .)) }}
{{- end }}

{{/* The Secret holding credentials.yaml. */}}
{{- define "ibex-context.credentialsSecretName" -}}
{{- .Values.security.auth.credentialsSecret | default (printf "%s-credentials" (include "ibex-context.fullname" .)) }}
{{- end }}

{{/* The Secret holding the token `helm test` sends. */}}
{{- define "ibex-context.testTokenSecretName" -}}
{{- .Values.security.auth.testTokenSecret | default (printf "%s-test-token" (include "ibex-context.fullname" .)) }}
{{- end }}

{{/* The port the kubelet's gRPC probes use: the plaintext health port when the gRPC port speaks TLS. */}}
{{- define "ibex-context.probePort" -}}
{{- if .Values.security.tls.enabled }}{{ .Values.security.tls.healthPort }}{{ else }}{{ .Values.server.grpcPort }}{{ end }}
{{- end }}

{{/*
Every store URL comes from a Secret the pods can find: the chart's own (an in-chart store) or the
one secrets.existingSecret names. Nothing else exists at install, so anything else is refused here
rather than leaving the migrations hook and the pods waiting on a missing Secret.
*/}}
{{- define "ibex-context.validateStores" -}}
{{- $keys := list }}
{{- if not .Values.redis.enabled }}{{ $keys = append $keys .Values.secrets.keys.redisUrl }}{{ end }}
{{- if not .Values.postgresql.enabled }}{{ $keys = append $keys .Values.secrets.keys.postgresDsn }}{{ end }}
{{- if and $keys (not .Values.secrets.existingSecret) }}
{{- $literals := list }}
{{- range $keys }}{{ $literals = append $literals (printf "--from-literal=%s=..." .) }}{{ end }}
{{- fail (printf "secrets.existingSecret is required: name the Secret holding the external stores' %s (kubectl create secret generic ibex-stores %s), or run in-chart stores on a laptop cluster (redis.enabled=true, postgresql.enabled=true)" (join " and " $keys) (join " " $literals)) }}
{{- end }}
{{- end }}

{{/*
The credentials the server reads and the token `helm test` sends come as a pair: both generated by
the chart, or both yours (your credentials file must then hold the digest of your test token).
*/}}
{{- define "ibex-context.validateAuth" -}}
{{- $auth := .Values.security.auth }}
{{- if $auth.enabled }}
{{- if and $auth.testTokenSecret (not $auth.credentialsSecret) }}
{{- fail "security.auth.testTokenSecret needs security.auth.credentialsSecret: the chart's generated credentials know only the test token it generates itself" }}
{{- end }}
{{- if and $auth.credentialsSecret (not $auth.testTokenSecret) .Values.tests.enabled }}
{{- fail "security.auth.testTokenSecret is required with security.auth.credentialsSecret (or tests.enabled=false): a Secret with key token, a bearer token your credentials.yaml grants the assemble role for tests.orgId" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the chart generates the gRPC port's CA and certificate (no cert-manager, no Secret of yours). */}}
{{- define "ibex-context.generatesTls" -}}
{{- $tls := .Values.security.tls }}
{{- if and $tls.enabled (not $tls.certManager.enabled) (not $tls.secretName) }}true{{ end }}
{{- end }}

{{/* "true" when the chart generates credentials.yaml, its bootstrap token and the test token. */}}
{{- define "ibex-context.generatesCredentials" -}}
{{- $auth := .Values.security.auth }}
{{- if and $auth.enabled (not $auth.credentialsSecret) }}true{{ end }}
{{- end }}

{{/* The chart-generated CA that signs the gRPC port's certificate (kept to renew it). */}}
{{- define "ibex-context.tlsCASecretName" -}}
{{- printf "%s-ca" (include "ibex-context.fullname" .) }}
{{- end }}

{{/* The chart-generated bootstrap credential: the installer's token (every role). */}}
{{- define "ibex-context.bootstrapTokenSecretName" -}}
{{- printf "%s-bootstrap-token" (include "ibex-context.fullname" .) }}
{{- end }}

{{/*
The TCP ports the server pods reach (a JSON list): networkPolicy.egressPorts, plus the ports the
configuration names itself, so a policy never silently drops what the values configure: each
sentinel's port (config.redis.mode=sentinel, 26379 by convention) and the OTLP endpoint's (4317 for
OTLP/gRPC; the scheme's default when the URL has none).
*/}}
{{- define "ibex-context.serverEgressPorts" -}}
{{- $ports := list }}
{{- range .Values.networkPolicy.egressPorts }}{{ $ports = append $ports (int .) }}{{ end }}
{{- $redis := .Values.config.redis }}
{{- if eq $redis.mode "sentinel" }}
{{- range $redis.sentinel.addresses }}
{{- $ports = append $ports (int (regexFind "[0-9]+$" .)) }}
{{- end }}
{{- end }}
{{- $tracing := .Values.config.tracing }}
{{- if and (eq $tracing.exporter "otlp") $tracing.otlpEndpoint }}
{{- $url := urlParse $tracing.otlpEndpoint }}
{{- $port := regexFind ":[0-9]+$" $url.host | trimPrefix ":" }}
{{- if not $port }}{{ $port = ternary "443" "80" (eq $url.scheme "https") }}{{ end }}
{{- $ports = append $ports (int $port) }}
{{- end }}
{{- $ports | uniq | toJson }}
{{- end }}

{{/*
Before generating a Secret under a name an installer may already have used (earlier versions of the
chart told them to create <fullname>-tls, -credentials, -test-token themselves): a live Secret of that
name that this release does not own is refused, naming the value that keeps it in use, instead of
Helm's bare ownership conflict. Pass (dict "ctx" $ "name" NAME "value" "security.tls.secretName").
*/}}
{{- define "ibex-context.refuseForeignSecret" -}}
{{- $live := lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- if $live }}
{{- $owner := index (($live.metadata).annotations | default dict) "meta.helm.sh/release-name" | default "" }}
{{- if ne $owner .ctx.Release.Name }}
{{- fail (printf "Secret %s exists and is not this release's (made by hand?): set %s=%s to keep using it, or delete it to let the chart generate its own" .name .value .name) }}
{{- end }}
{{- end }}
{{- end }}
