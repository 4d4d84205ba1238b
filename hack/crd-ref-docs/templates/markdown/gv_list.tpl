{{- /* From crd-ref-docs v0.3.0 (github.com/elastic/crd-ref-docs, templates/markdown, Apache-2.0); type.tpl adds the CEL rules. */ -}}
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
