package optcheck

import (
	"errors"
	"testing"
)

// A List with no problem has no error; with problems, an *Error that
// wraps the owner's sentinel and lists them in the order added, each as
// "Field Value: Reason"; Has tells which fields were named.
func TestList(t *testing.T) {
	kind := errors.New("owner: invalid options")
	l := New(kind)
	if err := l.Err(); err != nil {
		t.Fatalf("empty list: %v", err)
	}
	l.Add("PageBytes", 3000, "must be a power of two")
	l.Add("Dir", "", "is required")
	err := l.Err()
	if !errors.Is(err, kind) {
		t.Errorf("%v does not wrap the owner's sentinel", err)
	}
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 2 || e.Problems[0].Field != "PageBytes" || e.Problems[1].Field != "Dir" {
		t.Fatalf("problems %+v, want PageBytes then Dir", e)
	}
	if want := "owner: invalid options: PageBytes 3000: must be a power of two; Dir : is required"; err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
	if want := "must be a power of two; is required"; Reasons(err) != want {
		t.Errorf("Reasons %q, want %q", Reasons(err), want)
	}
	if other := errors.New("other"); Reasons(other) != "other" {
		t.Errorf("Reasons of another error %q, want its message", Reasons(other))
	}
	if !l.Has("Dir") || l.Has("CacheBytes") {
		t.Errorf("Has: Dir %t (want true), CacheBytes %t (want false)", l.Has("Dir"), l.Has("CacheBytes"))
	}
}
