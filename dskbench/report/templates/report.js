// The report's toolbar: filter kernels, only those with problems, expand/collapse; open a linked section.
(function(){
const ks=[...document.querySelectorAll('details.kernel')];
const f=document.getElementById('flt'),p=document.getElementById('onlyprob');
function apply(){const q=f.value.trim().toLowerCase();
 ks.forEach(k=>{const show=(!q||k.dataset.name.includes(q))&&(!p.checked||k.dataset.bad==='1');
 k.classList.toggle('hide',!show);});}
f.addEventListener('input',apply);p.addEventListener('change',apply);
document.getElementById('expand').onclick=()=>ks.forEach(k=>{if(!k.classList.contains('hide'))k.open=true;});
document.getElementById('collapse').onclick=()=>ks.forEach(k=>k.open=false);
function openHash(){const id=decodeURIComponent(location.hash.slice(1));const el=id&&document.getElementById(id);
 if(!el)return;for(let d=el;d;d=d.parentElement){if(d.tagName==='DETAILS'){d.open=true;d.classList.remove('hide');}}
 el.scrollIntoView();}
window.addEventListener('hashchange',openHash);openHash();
})();
