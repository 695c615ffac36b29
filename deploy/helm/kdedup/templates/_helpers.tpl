{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "kdedup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources. StatefulSet pods append "-<ordinal>"
and the controller adds a 10-character revision label, so it stays under 52
characters.
*/}}
{{- define "kdedup.fullname" -}}
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

{{- define "kdedup.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kdedup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kdedup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kdedup.labels" -}}
helm.sh/chart: {{ include "kdedup.chart" . }}
{{ include "kdedup.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: dedup-worker
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* metadata.annotations of every resource, with extra annotations merged in. */}}
{{- define "kdedup.annotations" -}}
{{- $a := merge (deepCopy (.extra | default dict)) (.root.Values.commonAnnotations | default dict) }}
{{- with $a }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "kdedup.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kdedup.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kdedup.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The session timeout the chart passes: the value, else 2m for static members,
else "" (the worker's default, 45s).
*/}}
{{- define "kdedup.sessionTimeout" -}}
{{- if .Values.kafka.sessionTimeout }}
{{- .Values.kafka.sessionTimeout }}
{{- else if .Values.staticMembership.enabled }}
{{- "2m" }}
{{- end }}
{{- end }}

{{/* Seconds in a Go duration such as 45s, 1m30s, 500ms, 2h (rounded up). */}}
{{- define "kdedup.durationSeconds" -}}
{{- $d := toString . }}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- $parts := regexFindAll "[0-9]*\\.?[0-9]+(ns|us|µs|ms|s|m|h)" $d -1 }}
{{- if ne (join "" $parts) (trimPrefix "+" $d) }}
{{- fail (printf "%q is not a duration such as 45s, 2m or 1h30m" $d) }}
{{- end }}
{{- range $parts }}
{{- $unit := regexFind "(ns|us|µs|ms|s|m|h)$" . }}
{{- $num := trimSuffix $unit . }}
{{- $total = addf $total (mulf (float64 $num) (get $units $unit)) }}
{{- end }}
{{- ceil $total | int64 }}
{{- end }}

{{/* Bytes in a Kubernetes quantity such as 2Gi, 1536Mi, 2G or 2147483648. */}}
{{- define "kdedup.quantityBytes" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- int64 . }}
{{- else }}
{{- $q := toString . }}
{{- $units := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 }}
{{- $num := regexFind "^[0-9]*\\.?[0-9]+" $q }}
{{- $suffix := trimPrefix $num $q }}
{{- if or (not $num) (not (hasKey $units $suffix)) }}
{{- fail (printf "resources.limits.memory %q: use a plain number of bytes or a Ki, Mi, Gi, Ti, k, M, G or T suffix" $q) }}
{{- end }}
{{- mulf (float64 $num) (get $units $suffix) | floor | int64 }}
{{- end }}
{{- end }}

{{/* terminationGracePeriodSeconds: the value, or session timeout + flush interval + 30s. */}}
{{- define "kdedup.terminationGracePeriodSeconds" -}}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- .Values.terminationGracePeriodSeconds | int64 }}
{{- else }}
{{- $session := include "kdedup.sessionTimeout" . | default "45s" }}
{{- $flush := .Values.storage.flushInterval | default "1s" }}
{{- /* With snapshots, a stop also uploads each partition's last state (at most 30s). */}}
{{- $snapshots := ternary 30 0 (ne (.Values.snapshots.url | default "") "") }}
{{- add (include "kdedup.durationSeconds" $session | int64) (include "kdedup.durationSeconds" $flush | int64) 30 $snapshots }}
{{- end }}
{{- end }}

{{/*
KDEDUP_SHUTDOWN_TIMEOUT: the value, or 5s under terminationGracePeriodSeconds
(at least 1s), so that a stop that hangs exits with its error before the
kubelet's SIGKILL.
*/}}
{{- define "kdedup.shutdownTimeout" -}}
{{- if .Values.shutdownTimeout }}
{{- .Values.shutdownTimeout }}
{{- else }}
{{- printf "%ds" (max 1 (sub (include "kdedup.terminationGracePeriodSeconds" . | int64) 5)) }}
{{- end }}
{{- end }}

{{/*
A chart value as the text of an env value: "" for null or "" (the worker's
default applies: no env entry). Lists are joined with commas; integral
numbers print without an exponent (YAML reads 10000000 as a float).
*/}}
{{- define "kdedup.envString" -}}
{{- $v := . }}
{{- if kindIs "invalid" $v }}
{{- else if kindIs "slice" $v }}
{{- join "," $v }}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) }}
{{- printf "%d" (int64 $v) }}
{{- else }}
{{- toString $v }}
{{- end }}
{{- end }}

{{/*
The worker container's env: POD_NAME, then every KDEDUP_* variable whose value
is set, in the order of `kdedup run -h`, then extraEnv.
*/}}
{{- define "kdedup.env" -}}
{{- $k := .Values.kafka }}
{{- $d := .Values.dedup }}
{{- $f := .Values.filter }}
{{- $s := .Values.storage }}
{{- $podName := dict "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name")) }}
{{- if $k.idPrefix }}
{{- $podName = dict "value" (printf "%s$(POD_NAME)" $k.idPrefix) }}
{{- end }}
{{- $tlsDir := include "kdedup.tlsDir" . }}
{{- $tls := and $k.tls.enabled true }}
{{- $sasl := ne ($k.sasl.mechanism | default "") "" }}
{{- $plain := list
  (list "KDEDUP_BROKERS" $k.brokers)
  (list "KDEDUP_INPUT_TOPICS" $k.inputTopics)
  (list "KDEDUP_OUTPUT_TOPIC" $k.outputTopic)
  (list "KDEDUP_DUPLICATES_TOPIC" $k.duplicatesTopic)
  (list "KDEDUP_DEAD_LETTER_TOPIC" $k.deadLetterTopic)
  (list "KDEDUP_REPARTITION_TOPIC" $k.repartitionTopic)
  (list "KDEDUP_MAX_RECORD_BYTES" $k.maxRecordBytes)
  (list "KDEDUP_MAX_DECOMPRESS_BYTES" $k.maxDecompressBytes)
  (list "KDEDUP_GROUP" $k.group)
  (list "KDEDUP_INSTANCE_ID" (ternary $podName nil .Values.staticMembership.enabled))
  (list "KDEDUP_START_OFFSET" $k.startOffset)
  (list "KDEDUP_METADATA_MAX_AGE" $k.metadataMaxAge)
  (list "KDEDUP_SESSION_TIMEOUT" (include "kdedup.sessionTimeout" .))
  (list "KDEDUP_DELIVERY" $k.delivery)
  (list "KDEDUP_TRANSACTIONAL_ID" (ternary $podName nil (eq ($k.delivery | default "") "exactly-once")))
  (list "KDEDUP_TRANSACTION_INTERVAL" $k.transactionInterval)
  (list "KDEDUP_REBUILD" $k.rebuild)
  (list "KDEDUP_KEY" $d.key)
  (list "KDEDUP_DELETE_HEADER" $d.deleteHeader)
  (list "KDEDUP_FORWARD_TOMBSTONES" $d.forwardTombstones)
  (list "KDEDUP_MAX_OCCURRENCES" $d.maxOccurrences)
  (list "KDEDUP_WINDOW" $d.window)
  (list "KDEDUP_WINDOW_GENERATIONS" $d.windowGenerations)
  (list "KDEDUP_WINDOW_REFRESH" $d.windowRefresh)
  (list "KDEDUP_TLS_ENABLED" (ternary "true" nil $tls))
  (list "KDEDUP_TLS_CA_FILE" (ternary (printf "%s/%s" $tlsDir $k.tls.caKey) nil (and $tls $k.tls.existingSecret $k.tls.caKey | empty | not)))
  (list "KDEDUP_TLS_CERT_FILE" (ternary (printf "%s/%s" $tlsDir $k.tls.certKey) nil (and $tls $k.tls.certKey | empty | not)))
  (list "KDEDUP_TLS_KEY_FILE" (ternary (printf "%s/%s" $tlsDir $k.tls.keyKey) nil (and $tls $k.tls.keyKey | empty | not)))
  (list "KDEDUP_TLS_SERVER_NAME" (ternary $k.tls.serverName nil $tls))
  (list "KDEDUP_SASL_MECHANISM" (ternary $k.sasl.mechanism nil $sasl))
  (list "KDEDUP_SASL_USERNAME" (ternary (ternary (dict "valueFrom" (dict "secretKeyRef" (dict "name" $k.sasl.existingSecret "key" $k.sasl.usernameKey))) $k.sasl.username (ne ($k.sasl.usernameKey | default "") "")) nil $sasl))
  (list "KDEDUP_SASL_PASSWORD_FILE" (ternary (printf "%s/%s" (include "kdedup.saslDir" .) $k.sasl.passwordKey) nil $sasl))
  (list "KDEDUP_TARGET_FPR" $f.targetFPR)
  (list "KDEDUP_FINGERPRINT_BITS" $f.fingerprintBits)
  (list "KDEDUP_BUCKET_SIZE" $f.bucketSize)
  (list "KDEDUP_CAPACITY" $f.capacity)
  (list "KDEDUP_MAX_KICKS" $f.maxKicks)
  (list "KDEDUP_EXPANSION" $f.expansion)
  (list "KDEDUP_DATA_DIR" .Values.persistence.mountPath)
  (list "KDEDUP_PAGE_BYTES" $s.pageBytes)
  (list "KDEDUP_MEMORY_BYTES" $s.memoryBytes)
  (list "KDEDUP_CACHE_BYTES" $s.cacheBytes)
  (list "KDEDUP_FLUSH_INTERVAL" $s.flushInterval)
  (list "KDEDUP_FLUSH_BYTES" $s.flushBytes)
  (list "KDEDUP_WRITE_BACK_INTERVAL" $s.writeBackInterval)
  (list "KDEDUP_SNAPSHOT_URL" .Values.snapshots.url)
  (list "KDEDUP_SNAPSHOT_INTERVAL" .Values.snapshots.interval)
  (list "KDEDUP_SNAPSHOT_KEEP" .Values.snapshots.keep)
  (list "KDEDUP_HTTP_ADDR" (printf ":%d" (int .Values.http.port)))
  (list "KDEDUP_PPROF" (ternary "true" nil (.Values.http.pprof | default false)))
  (list "KDEDUP_LOG_LEVEL" .Values.log.level)
  (list "KDEDUP_LOG_FORMAT" .Values.log.format)
  (list "KDEDUP_SHUTDOWN_TIMEOUT" (include "kdedup.shutdownTimeout" .))
  (list "KDEDUP_LIVENESS_TIMEOUT" .Values.livenessTimeout)
}}
{{- $env := list (dict "name" "POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) }}
{{- range $plain }}
{{- $name := index . 0 }}
{{- $v := index . 1 }}
{{- if kindIs "map" $v }}
{{- $env = append $env (merge (dict "name" $name) $v) }}
{{- else }}
{{- $text := include "kdedup.envString" $v }}
{{- if ne $text "" }}
{{- $env = append $env (dict "name" $name "value" $text) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* The worker sizes itself from the container's memory limit (cgroup):
nothing here derives GOMEMLIMIT or a cache from it. The limit is checked so
that a typo fails here rather than at the API server. */}}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- if $limit }}
{{- $_ := include "kdedup.quantityBytes" $limit }}
{{- end }}
{{- toYaml (concat $env (.Values.extraEnv | default list)) }}
{{- end }}

{{/* Paths of the mounted Secrets. */}}
{{- define "kdedup.tlsDir" -}}/etc/kdedup/tls{{- end }}
{{- define "kdedup.saslDir" -}}/etc/kdedup/sasl{{- end }}

{{/* Configuration errors that the schema cannot express. */}}
{{- define "kdedup.validate" -}}
{{- $k := .Values.kafka }}
{{- if not $k.brokers }}{{ fail "kafka.brokers is required: the Kafka seed brokers, host:port" }}{{ end }}
{{- if not $k.inputTopics }}{{ fail "kafka.inputTopics is required: the topics to deduplicate" }}{{ end }}
{{- if not $k.outputTopic }}{{ fail "kafka.outputTopic is required: the topic that receives the first record of each key" }}{{ end }}
{{- if and .Values.shutdownTimeout (ge (include "kdedup.durationSeconds" .Values.shutdownTimeout | int64) (include "kdedup.terminationGracePeriodSeconds" . | int64)) }}{{ fail (printf "shutdownTimeout %s must be under terminationGracePeriodSeconds (%s): the kubelet kills the worker then, before it can report what its stop was waiting for" .Values.shutdownTimeout (include "kdedup.terminationGracePeriodSeconds" .)) }}{{ end }}
{{- if and $k.tls.existingSecret (not $k.tls.enabled) }}{{ fail "kafka.tls.existingSecret needs kafka.tls.enabled=true" }}{{ end }}
{{- if and (not $k.tls.existingSecret) (or $k.tls.certKey $k.tls.keyKey) }}{{ fail "kafka.tls.certKey and keyKey name keys of kafka.tls.existingSecret, which is empty" }}{{ end }}
{{- if ne (not $k.tls.certKey) (not $k.tls.keyKey) }}{{ fail "kafka.tls.certKey and kafka.tls.keyKey go together: a client certificate needs its key" }}{{ end }}
{{- if and .Values.snapshots.existingSecret (not .Values.snapshots.url) }}{{ fail "snapshots.existingSecret needs snapshots.url: the credentials are for the snapshot store" }}{{ end }}
{{- if $k.sasl.mechanism }}
{{- if not $k.sasl.existingSecret }}{{ fail "kafka.sasl.mechanism needs kafka.sasl.existingSecret, the Secret holding the password (never inlined in values)" }}{{ end }}
{{- if and (not $k.sasl.username) (not $k.sasl.usernameKey) }}{{ fail "kafka.sasl.mechanism needs kafka.sasl.username or kafka.sasl.usernameKey" }}{{ end }}
{{- else if or $k.sasl.existingSecret $k.sasl.username $k.sasl.usernameKey }}
{{- fail "kafka.sasl.existingSecret, username and usernameKey need kafka.sasl.mechanism" }}
{{- end }}
{{- end }}
