{{- define "nodewright.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "nodewright.labels" -}}
app.kubernetes.io/name: nodewright
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- /*
The Deployments the layout makes, as JSON: name -> {replicas, resources, members}. perService:
one per service, each its only member. oneProcess: one, "services", whose pods run all five
(python -m services). Every template that names a workload, its account, its Services or its
monitors goes through this, so both layouts stay alike.
*/ -}}
{{- define "nodewright.workloads" -}}
{{- $all := list "drainer" "executor" "scheduler" "status" "validator" -}}
{{- $workloads := dict -}}
{{- if eq .Values.layout "oneProcess" -}}
{{- $_ := set $workloads "services" (dict "replicas" .Values.oneProcess.replicas "resources" .Values.oneProcess.resources "members" $all) -}}
{{- else -}}
{{- range $name := $all -}}
{{- $svc := index $.Values.services $name -}}
{{- $_ := set $workloads $name (dict "replicas" $svc.replicas "resources" $svc.resources "members" (list $name)) -}}
{{- end -}}
{{- end -}}
{{- toJson $workloads -}}
{{- end -}}

{{- /* The component (workload) whose pods run the service given as the argument's .service. */ -}}
{{- define "nodewright.componentOf" -}}
{{- if eq .root.Values.layout "oneProcess" -}}services{{- else -}}{{ .service }}{{- end -}}
{{- end -}}
