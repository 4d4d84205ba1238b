{{- define "gvList" -}}
{{- $groupVersions := . -}}

# API Reference

Generated from the Go types in `api/` by `make docs` (crd-ref-docs, with the templates of
`hack/crd-ref-docs`); do not edit. `make verify` fails when it is stale. `kubectl explain`
shows the same field documentation from the installed CRDs.

## Packages
{{- range $groupVersions }}
- {{ markdownRenderGVLink . }}
{{- end }}

{{ range $groupVersions }}
{{ template "gvDetails" . }}
{{ end }}

{{- end -}}
