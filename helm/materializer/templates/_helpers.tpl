{{/* Names, labels and the rendered maps.yaml. */}}

{{- define "materializer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "materializer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Component names, short enough for Service names (63 characters). */}}
{{- define "materializer.query.fullname" -}}
{{- printf "%s-query" (include "materializer.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "materializer.driver.fullname" -}}
{{- printf "%s-driver" (include "materializer.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "materializer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "materializer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "materializer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "materializer.labels" -}}
helm.sh/chart: {{ include "materializer.chart" . }}
{{ include "materializer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "materializer.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{- define "materializer.driver.serviceAccountName" -}}
{{- if .Values.driver.serviceAccount.create }}
{{- default (include "materializer.driver.fullname" .) .Values.driver.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.driver.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "materializer.dataClaimName" -}}
{{- default (printf "%s-data" (include "materializer.fullname" .)) .Values.storage.pvc.existingClaim }}
{{- end }}

{{/* The worker group every driver pod joins: driver.group, or the release's full name. */}}
{{- define "materializer.driver.group" -}}
{{- default (include "materializer.fullname" .) .Values.driver.group }}
{{- end }}

{{/* More than one driver: a worker group spread over pods (and nodes). */}}
{{- define "materializer.driver.several" -}}
{{- if gt (int .Values.driver.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
The data volume's access modes, as JSON: storage.pvc.accessModes, or when that is
empty [ReadWriteMany] for several drivers and [ReadWriteOnce] for one.
*/}}
{{- define "materializer.dataAccessModes" -}}
{{- $modes := .Values.storage.pvc.accessModes | default list }}
{{- if and (not $modes) (include "materializer.driver.several" .) }}
{{- $modes = list "ReadWriteMany" }}
{{- else if not $modes }}
{{- $modes = list "ReadWriteOnce" }}
{{- end }}
{{- toJson $modes }}
{{- end }}

{{/*
Several drivers share the checkpoints: a map's checkpoint moves with the map from one
worker to another, so every driver pod must reach them. A volume only one node mounts
(ReadWriteOnce, ReadWriteOncePod) cannot be shared by drivers on other nodes.
*/}}
{{- define "materializer.checkSharedCheckpoints" -}}
{{- if and (include "materializer.driver.several" .) (eq .Values.storage.type "pvc") }}
{{- $modes := include "materializer.dataAccessModes" . | fromJsonArray }}
{{- if not (has "ReadWriteMany" $modes) }}
{{- fail (printf "driver.replicas %d: the drivers of a worker group share the checkpoints, which must be on the object store (storage.type objectStore) or on a ReadWriteMany volume, not on one with accessModes %s (storage.pvc.accessModes); set driver.replicas to 1 for a single driver on this volume" (int .Values.driver.replicas) (toJson $modes)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
spark.stop_timeout in whole seconds (100 when unset), for the driver pods' grace
period. A duration is a number of seconds or a number and a unit, as the config takes.
*/}}
{{- define "materializer.stopTimeoutSeconds" -}}
{{- $spark := .Values.spark | default dict }}
{{- $timeout := 100 }}
{{- if hasKey $spark "stop_timeout" }}
{{- $timeout = $spark.stop_timeout }}
{{- end }}
{{- if kindIs "string" $timeout }}
{{- $text := $timeout | trim | lower }}
{{- $number := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $text }}
{{- $unit := trimPrefix $number $text | trim }}
{{- $units := dict "" 1.0 "s" 1.0 "sec" 1.0 "secs" 1.0 "second" 1.0 "seconds" 1.0 }}
{{- $_ := merge $units (dict "ms" 0.001 "millisecond" 0.001 "milliseconds" 0.001) }}
{{- $_ := merge $units (dict "m" 60.0 "min" 60.0 "mins" 60.0 "minute" 60.0 "minutes" 60.0) }}
{{- $_ := merge $units (dict "h" 3600.0 "hour" 3600.0 "hours" 3600.0 "d" 86400.0 "day" 86400.0 "days" 86400.0) }}
{{- if or (not $number) (not (hasKey $units $unit)) }}
{{- fail (printf "spark.stop_timeout: %q is not a duration such as \"100 seconds\"" $timeout) }}
{{- end }}
{{- $timeout = mulf (float64 $number) (get $units $unit) }}
{{- end }}
{{- ceil $timeout | int }}
{{- end }}

{{- define "materializer.authSecretName" -}}
{{- default (printf "%s-query-auth" (include "materializer.fullname" .)) .Values.queryService.auth.existingSecret }}
{{- end }}

{{- define "materializer.tlsSecretName" -}}
{{- default (printf "%s-query-tls" (include "materializer.fullname" .)) .Values.queryService.tls.existingSecret }}
{{- end }}

{{/* Mount points inside the containers. */}}
{{- define "materializer.configDir" -}}/etc/materializer{{- end }}
{{- define "materializer.configPath" -}}/etc/materializer/maps.yaml{{- end }}
{{- define "materializer.authDir" -}}/etc/materializer/auth{{- end }}
{{- define "materializer.tlsDir" -}}/etc/materializer/tls{{- end }}
{{- define "materializer.dataDir" -}}/data{{- end }}

{{- define "materializer.deltaRoot" -}}
{{- if eq .Values.storage.type "pvc" }}
{{- printf "%s/warehouse" (include "materializer.dataDir" .) }}
{{- else }}
{{- required "storage.objectStore.deltaRoot is required with storage.type objectStore" .Values.storage.objectStore.deltaRoot }}
{{- end }}
{{- end }}

{{- define "materializer.checkpointRoot" -}}
{{- if eq .Values.storage.type "pvc" }}
{{- printf "%s/checkpoints" (include "materializer.dataDir" .) }}
{{- else }}
{{- required "storage.objectStore.checkpointRoot is required with storage.type objectStore" .Values.storage.objectStore.checkpointRoot }}
{{- end }}
{{- end }}

{{/*
The Spark settings of driver.mode kubernetes: where executors run, which image and
account they use, and how they reach the driver: a single driver through its headless
Service; each driver of a group through its own pod's address (SPARK_LOCAL_HOSTNAME),
its executor pods named by Spark after its own application so that no two clash.
*/}}
{{- define "materializer.sparkKubernetesConf" -}}
{{- $driver := .Values.driver -}}
{{- $conf := dict
  "spark.submit.deployMode" "client"
  "spark.kubernetes.namespace" .Release.Namespace
  "spark.kubernetes.container.image" (include "materializer.image" .)
  "spark.kubernetes.container.image.pullPolicy" .Values.image.pullPolicy
  "spark.kubernetes.authenticate.driver.serviceAccountName" (include "materializer.driver.serviceAccountName" .)
  "spark.kubernetes.executor.podTemplateFile" (printf "%s/executor-pod-template.yaml" (include "materializer.configDir" .))
  "spark.driver.bindAddress" "0.0.0.0"
  "spark.driver.port" ($driver.driverPort | toString)
  "spark.driver.blockManager.port" ($driver.blockManagerPort | toString)
  "spark.executor.instances" ($driver.executor.instances | toString)
  "spark.executor.cores" ($driver.executor.cores | toString)
  "spark.executor.memory" ($driver.executor.memory | toString)
-}}
{{- if not (include "materializer.driver.several" .) }}
{{- $_ := set $conf "spark.kubernetes.executor.podNamePrefix" (include "materializer.driver.fullname" .) }}
{{- $_ := set $conf "spark.driver.host" (printf "%s.%s.svc" (include "materializer.driver.fullname" .) .Release.Namespace) }}
{{- end }}
{{- with $driver.executor.requestCores }}
{{- $_ := set $conf "spark.kubernetes.executor.request.cores" (toString .) }}
{{- end }}
{{- if eq .Values.storage.type "pvc" }}
{{- $prefix := "spark.kubernetes.executor.volumes.persistentVolumeClaim.data" }}
{{- $_ := set $conf (printf "%s.options.claimName" $prefix) (include "materializer.dataClaimName" .) }}
{{- $_ := set $conf (printf "%s.mount.path" $prefix) (include "materializer.dataDir" .) }}
{{- $_ := set $conf (printf "%s.mount.readOnly" $prefix) "false" }}
{{- end }}
{{- toYaml $conf }}
{{- end }}

{{/* maps.yaml: the application config blocks of the values, with the chart's settings. */}}
{{- define "materializer.config" -}}
{{- $v := .Values -}}
{{- $delta := set (deepCopy ($v.delta | default dict)) "root" (include "materializer.deltaRoot" .) -}}
{{- $spark := deepCopy ($v.spark | default dict) -}}
{{- $_ := set $spark "checkpoint_root" (include "materializer.checkpointRoot" .) -}}
{{- if eq $v.driver.mode "kubernetes" }}
{{- $_ := set $spark "master" "k8s://https://kubernetes.default.svc" -}}
{{- /* Executors run the driver's image: its jars are on their class path, not copied. */ -}}
{{- $_ := set $spark "jars" "installed" -}}
{{- $_ := set $spark "conf" (merge (deepCopy ($spark.conf | default dict)) (include "materializer.sparkKubernetesConf" . | fromYaml)) -}}
{{- else }}
{{- $_ := set $spark "master" "local[*]" -}}
{{- end }}
{{- $qs := $v.queryService -}}
{{- $query := deepCopy ($v.query | default dict) -}}
{{- $_ := set $query "port" $qs.port -}}
{{- $_ := set $query "metrics_port" $qs.metricsPort -}}
{{- $_ := set $query "http_port" $qs.httpPort -}}
{{- $sql := deepCopy ($query.sql | default dict) -}}
{{- $_ := set $sql "flight_port" $qs.flightSqlPort -}}
{{- $_ := set $query "sql" $sql -}}
{{- if $qs.auth.enabled }}
{{- $_ := set $query "auth" (dict "tokens_file" (printf "%s/%s" (include "materializer.authDir" .) $qs.auth.tokensKey)) -}}
{{- end }}
{{- if $qs.tls.enabled }}
{{- $tlsDir := include "materializer.tlsDir" . -}}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" $tlsDir) "key_file" (printf "%s/tls.key" $tlsDir) -}}
{{- if $qs.tls.mutual }}
{{- $_ := set $tls "client_ca_file" (printf "%s/ca.crt" $tlsDir) -}}
{{- end }}
{{- $_ := set $query "tls" $tls -}}
{{- end }}
{{- $metrics := set (deepCopy ($v.metrics | default dict)) "port" $v.driver.metricsPort -}}
{{- /* worker.group and worker.id come through the driver pods' environment. */ -}}
{{- $config := dict
  "kafka" ($v.kafka | default dict)
  "redis" ($v.redis | default dict)
  "delta" $delta
  "spark" $spark
  "query" $query
  "metrics" $metrics
  "worker" ($v.worker | default dict)
  "maps" ($v.maps | default dict)
  "enrichments" ($v.enrichments | default dict)
-}}
{{- if eq $v.storage.type "objectStore" }}
{{- /* Keys come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY through
       extraEnv) or the pod's role: both hadoop-aws and delta-rs read them there. */}}
{{- $os := $v.storage.objectStore -}}
{{- $store := dict "region" ($os.region | default "us-east-1") "path_style" ($os.pathStyle | default false) -}}
{{- with $os.endpoint }}
{{- $_ := set $store "endpoint" . -}}
{{- end }}
{{- $_ := set $config "object_store" $store -}}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The executor pods' template (driver.mode kubernetes). The image runs its arguments under
tini, not Spark's entrypoint script, so the executor container gets its own command:
Spark appends the argument "executor" and hands everything else over in SPARK_*
variables, which this script turns into the JVM command line Spark's own images run.
tini stays process 1, to reap the Python workers the executor starts.
*/}}
{{- define "materializer.executorPodTemplate" -}}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "materializer.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: executor
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: spark-executor
      command:
        - tini
        - --
        - /bin/bash
        - -c
        - |
          set -euo pipefail
          readarray -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
          exec java "${java_opts[@]}" -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
            -cp "$SPARK_HOME/jars/*:$MATERIALIZER_JARS_DIR/spark/*:$MATERIALIZER_JARS_DIR/s3/*" \
            org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
            --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
            --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
            --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
            --podName "$SPARK_EXECUTOR_POD_NAME"
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: [ALL]
{{- end }}

{{/* Environment shared by the driver and the query service. */}}
{{- define "materializer.commonEnv" -}}
- name: HOME
  value: /tmp
- name: MATERIALIZER_LOG_FORMAT
  value: {{ .Values.logFormat | default "json" | quote }}
{{- with .Values.redisUrlSecret.name }}
- name: MATERIALIZER_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.redisUrlSecret.key }}
{{- end }}
{{- end }}

{{- define "materializer.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "materializer.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}
