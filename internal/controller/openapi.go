package controller

import (
	"reflect"
	"regexp"
	"strings"
	"time"
)

var pathParam = regexp.MustCompile(`\{([a-z]+)\}`)

// openAPI builds the OpenAPI 3.1 document of the operator API from its
// routes: the same table serves the requests and documents them, so the
// two cannot drift apart.
func openAPI(routes []route) map[string]any {
	paths := map[string]any{}
	schemas := map[string]any{}
	for _, rt := range routes {
		op := map[string]any{
			"summary":     rt.summary,
			"operationId": opID(rt.method, rt.path),
			"responses": map[string]any{
				"200": map[string]any{"description": "success", "content": jsonContent(rt.response, schemas)},
				"400": errResponse("invalid request: the message says which field and why"),
				"404": errResponse("no such user, service or node"),
				"401": errResponse("no token, or a wrong one: the message says how to authenticate"),
			},
		}
		if rt.method == "POST" && strings.Count(rt.path, "/") == 2 {
			op["responses"].(map[string]any)["201"] = map[string]any{"description": "created", "content": jsonContent(rt.response, schemas)}
		}
		if rt.path == "/v1/stream" {
			op["responses"].(map[string]any)["200"] = map[string]any{"description": "text/event-stream of StreamEvent JSON objects",
				"content": map[string]any{"text/event-stream": map[string]any{"schema": schemaOf(reflect.TypeOf(StreamEvent{}), schemas)}}}
		}
		var params []any
		for _, m := range pathParam.FindAllStringSubmatch(rt.path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		if strings.HasSuffix(rt.summary, "(?limit=&before=)") || strings.Contains(rt.summary, "newest first") {
			params = append(params,
				map[string]any{"name": "limit", "in": "query", "schema": map[string]any{"type": "integer", "minimum": 1, "maximum": 10000}},
				map[string]any{"name": "before", "in": "query", "description": "only entries with a smaller id", "schema": map[string]any{"type": "integer"}})
		}
		if params != nil {
			op["parameters"] = params
		}
		if rt.request != nil {
			op["requestBody"] = map[string]any{"required": true, "content": jsonContent(rt.request, schemas)}
		}
		item, _ := paths[rt.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.path] = item
		}
		item[strings.ToLower(rt.method)] = op
	}
	schemas["Error"] = map[string]any{"type": "object", "properties": map[string]any{
		"error": map[string]any{"type": "string"}, "code": map[string]any{"type": "string", "enum": []string{"invalid", "not_found", "forbidden", "unauthenticated", "misdirected", "unsupported_media_type", "internal"}}}}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "edgehop controller", "version": "1",
			"description": "Topology, users, services and their policies; decisions, handoffs and migrations with their history. Errors are {\"error\", \"code\"}. " +
				"Every request needs the controller's token (Authorization: Bearer, or the cookie GET /login?token= sets), an allowed Host, no foreign Origin, and a JSON body."},
		"paths":      paths,
		"components": map[string]any{"schemas": schemas, "securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}}},
		"security":   []any{map[string]any{"bearer": []any{}}},
	}
}

func opID(method, path string) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(method))
	for _, part := range strings.Split(path, "/") {
		part = strings.Trim(part, "{}")
		if part == "" || part == "v1" {
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

func errResponse(desc string) map[string]any {
	return map[string]any{"description": desc, "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
}

func jsonContent(v any, schemas map[string]any) map[string]any {
	return map[string]any{"application/json": map[string]any{"schema": schemaOf(reflect.TypeOf(v), schemas)}}
}

var timeType = reflect.TypeOf(time.Time{})

// schemaOf describes t as a JSON schema; named structs go to schemas and
// are referenced.
func schemaOf(t reflect.Type, schemas map[string]any) map[string]any {
	if t == nil {
		return map[string]any{}
	}
	if t == timeType {
		return map[string]any{"type": "string", "format": "date-time"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return schemaOf(t.Elem(), schemas)
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // json.RawMessage
			return map[string]any{}
		}
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), schemas)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), schemas)}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		name := t.Name()
		if name != "" {
			if _, done := schemas[name]; done {
				return map[string]any{"$ref": "#/components/schemas/" + name}
			}
			schemas[name] = map[string]any{} // breaks cycles
		}
		props := map[string]any{}
		addFields(t, props, schemas)
		s := map[string]any{"type": "object", "properties": props}
		if name == "" {
			return s
		}
		schemas[name] = s
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	return map[string]any{}
}

func addFields(t reflect.Type, props map[string]any, schemas map[string]any) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			addFields(f.Type, props, schemas)
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = schemaOf(f.Type, schemas)
	}
}
